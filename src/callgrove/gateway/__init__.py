"""The capture gateway: real harnesses in front, any inference server behind, every call recorded."""
