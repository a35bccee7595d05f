"""Oculis control plane: reconciles GPUUpstream and InferenceRoute into workloads."""
