"""The embedders behind one port: the local ONNX model and an OpenAI-compatible endpoint, and
the choice between them (`choose.make_embedder`)."""
