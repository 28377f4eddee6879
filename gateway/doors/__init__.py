"""Front doors: each API's request bodies, answer documents and stream events (OpenAI, Anthropic,
Responses, embeddings), and the operator's admin API."""
