"""llama.cpp's auto-parser: a template's tool-call and reasoning markers derived from the
template itself (render it with and without a call, diff the renders)."""
