"""Stage 3, the answer: the verdict rules over the compared rows, symptom -> cause per sample, the run across
global steps. Writes no file. Imports pairing and comparing only."""
