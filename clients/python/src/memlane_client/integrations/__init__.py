"""Adapters for agent frameworks, each an extra of this package: `langgraph`, `langchain`,
`openai-agents`, `llama-index`."""
