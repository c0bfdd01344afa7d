"""Serving a policy over the client APIs: OpenAI chat and completions, Anthropic Messages and
OpenAI Responses, parsed into one request form and answered (whole or streamed) per protocol.

The capture gateway (`callgrove.gateway`) and `serve-policy` (`serving.policy_server`) both
speak through it, so a request means the same thing to either server.
"""
