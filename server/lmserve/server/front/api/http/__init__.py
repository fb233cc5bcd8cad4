"""The HTTP front: the same service as the gRPC port, for browsers, curl and OpenAI clients."""
