"""The embedding engine: embedding and rerank inputs turned into sequences, and the embedder thread
that decodes them."""
