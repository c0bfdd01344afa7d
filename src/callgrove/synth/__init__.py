"""Synthetic workloads: multi-agent episodes of a chosen shape, seeded and reproducible."""

from callgrove.synth.workload import PRESETS, Shape, call_tokens, synth_episode, synth_episodes

__all__ = ["PRESETS", "Shape", "call_tokens", "synth_episode", "synth_episodes"]
