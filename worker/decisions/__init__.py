"""Decision jobs: the plan (prompts, label tries, readout math), the decision-head families'
prompts, and their run on the engine's thread."""
