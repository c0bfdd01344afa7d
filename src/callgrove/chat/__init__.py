"""One chat layer: a conversation's messages to tokens, one message at a time, and back.

Every place that tokenizes a conversation (the RL environments, the transcript importer, the
gateway, `serve-policy`) renders through a `ChatFormat`, so the same conversation is the same
tokens in RL data and in SFT data:

- `BuiltinFormat`: UTF-8 bytes and two turn markers (nothing to download);
- `JinjaFormat`: a model's `tokenizer.json` and Jinja chat template, from files, a model folder,
  or a Hugging Face tokenizer held in memory (`JinjaFormat.from_tokenizer`);
- `CharFormat`: the reference decoder's character vocabulary (the built-in RL environments).
"""

from callgrove.chat.builtin import BuiltinFormat, ByteTokenizer
from callgrove.chat.chars import CharFormat
from callgrove.chat.format import ChatFormat
from callgrove.chat.message import Message, ToolCall
from callgrove.chat.parse import PARSERS, parse_hermes, tools_message
from callgrove.chat.template import ChatTemplate, JinjaFormat

__all__ = [
    "PARSERS",
    "BuiltinFormat",
    "ByteTokenizer",
    "CharFormat",
    "ChatFormat",
    "ChatTemplate",
    "JinjaFormat",
    "Message",
    "ToolCall",
    "parse_hermes",
    "tools_message",
]
