"""Chat: templates, messages and output parsing for the OpenAI and Anthropic APIs."""
