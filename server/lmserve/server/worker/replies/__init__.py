"""Responses built where they are computed: Score's and Generate's protobuf bytes."""
