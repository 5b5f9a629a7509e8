"""Stack Overflow (TFF release) without TensorFlow: files, database, Example decoding,
vocabularies and the NWP / tag preprocessing, exactly as ``docs/stackoverflow_format.md``
specifies (read off TFF's source)."""
