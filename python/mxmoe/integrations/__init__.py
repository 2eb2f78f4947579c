"""mxmoe inside other frameworks' models: `mxmoe.integrations.transformers` (gpt-oss in transformers)."""
