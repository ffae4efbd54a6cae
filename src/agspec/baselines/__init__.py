"""Baseline drafters (PLD, REST, SAM-Decoding, SuffixDecoding, FastCoder), each a `CallDrafter`."""
