"""Tests of the documentation: the code blocks of the how-tos run as written, and the generated
command-line reference is current."""
