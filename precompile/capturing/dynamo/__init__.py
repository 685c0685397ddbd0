"""The Dynamo tracer: a capture session over torch.compile's frame evaluator, its guards accounted for,
rendered as checks or kept opaque, and its subgraphs lowered for the standalone layout."""
