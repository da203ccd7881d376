"""A vocabulary built from a set of strings, as min-char-rnn builds its characters: its order
follows Python's string hashes (PYTHONHASHSEED). No torch: the order is what ranks must share."""
import os

words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "jumbled vexing crates of zebras and mangoes").split()
vocab = list(set(words))
print("vocabulary", " ".join(vocab))
print("child hashes like a program alone:", os.environ.get("PYTHONHASHSEED") is None)
