"""The settings framework (flags over environment over defaults) and the spec's flag table:
the bottom layer, which imports nothing else of llamaq."""
