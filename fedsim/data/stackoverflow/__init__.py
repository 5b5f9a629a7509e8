"""Stack Overflow (TFF release) without TensorFlow: files, database, Example decoding,
vocabularies and the NWP / tag preprocessing, exactly as ``shared/datasets/STACKOVERFLOW_FORMAT.md``
specifies (read off TFF's source)."""
