"""Benchmark streams: datasets, batched transforms, partitioners, the stream registry."""
