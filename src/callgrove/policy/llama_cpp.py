"""llama-cpp-python's OpenAI server as the upstream of a pass-through gateway.

The server renders a chat with its GGUF file's own template, samples, and reports each completion
token's log-probability beside the token's text, but no token ids. They are recovered here with
the same file's tokenizer and template, through llama-cpp-python itself (its vocabulary alone,
no weights): the prompt is rendered and tokenized exactly as the server does it, and its length
checked against the prompt size the server reports; the completion's text is tokenized and
checked token by token against the pieces the server reports. Any disagreement is an
`UpstreamError` naming it, never a guess.

The log-probabilities are the server's: behaviour-policy log-probabilities of quantized compute,
not what the trainer's float weights give. llama.cpp reports them from the untempered, untruncated
distribution, so a call is sampled from that distribution (temperature 1, top-p 1, and no top-k
or min-p, which llama.cpp otherwise applies by default); other sampling settings are refused. A
completion that ends on the end-of-turn token is reported without it (the server drops it), so
the recorded completion is the text's tokens alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from callgrove.episode import LOGPROB_DTYPE, TOKEN_DTYPE
from callgrove.errors import InvalidValue
from callgrove.policy.client import Completion, SamplingParams
from callgrove.policy.http import HttpPolicyClient, UpstreamError, distribution_fields
from callgrove.sampling import Distribution


class LlamaCppPolicyClient(HttpPolicyClient):
    """Pass-through chat against llama-cpp-python's server of the GGUF file `gguf`."""

    def __init__(self, base_url: str, gguf: str | Path, **options: Any):
        super().__init__(base_url, **options)
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.gguf = Path(gguf)
        self.vocab = Llama(model_path=str(self.gguf), vocab_only=True, verbose=False)
        template = self.vocab.metadata.get("tokenizer.chat_template")
        if self.vocab.chat_format != "chat_template.default" or not template:
            raise InvalidValue(
                f"{self.gguf}: the server would render with llama.cpp's built-in "
                f"{self.vocab.chat_format!r} format, not the file's own chat template; only the "
                "file's template can be reproduced to recover prompt token ids"
            )
        # As the server builds its formatter from the same file.
        self.formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._token_text(self.vocab.token_eos()),
            bos_token=self._token_text(self.vocab.token_bos()),
            stop_token_ids=[self.vocab.token_eos()],
        )

    def _token_text(self, token: int) -> str:
        return self.vocab._model.token_get_text(token) if token != -1 else ""

    async def chat(
        self, messages: list[dict], tools: list[dict], params: SamplingParams
    ) -> tuple[np.ndarray, Completion, dict]:
        if not params.whole:
            raise UpstreamError(
                "llama-cpp-python reports log-probabilities of the untempered distribution: "
                "sample at temperature 1, top_p 1 and no top_k (asked "
                f"{distribution_fields(params)}) for them to be the behaviour policy's",
                status=400,
            )
        body: dict[str, object] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "logprobs": True,
            "top_logprobs": 0,
        }
        if tools:
            body["tools"] = tools
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        payload = await self._post("/v1/chat/completions", body)
        try:
            choice = payload["choices"][0]
            message = choice["message"]
            reported = (choice.get("logprobs") or {}).get("content") or []
            pieces = [str(entry["token"]) for entry in reported]
            logprobs = [float(entry["logprob"]) for entry in reported]
            prompt_size = int(payload["usage"]["prompt_tokens"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise UpstreamError(
                "llama-cpp-python chat response lacks choices[0].message, its logprobs.content "
                "(token, logprob) or usage.prompt_tokens: start the server with --logits_all true"
            ) from None
        prompt = self._prompt_ids(messages, tools, prompt_size)
        completion = self._completion_ids(pieces)
        sample = Completion(
            completion_ids=completion,
            logprobs=np.asarray(logprobs, dtype=LOGPROB_DTYPE),
            policy_version=self._version,
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            sampling=Distribution().record(),  # what was sent: the whole distribution
        )
        return prompt, sample, message

    def _prompt_ids(self, messages: list[dict], tools: list[dict], reported: int) -> np.ndarray:
        """The prompt as the server tokenized it: its template's text, tokenized with specials."""
        rendered = self.formatter(messages=messages, tools=tools or None)
        ids = self.vocab.tokenize(
            rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
        )
        if len(ids) != reported:
            raise UpstreamError(
                f"the prompt rendered from {self.gguf.name}'s template has {len(ids)} tokens, "
                f"the server reports {reported}: it rendered the chat otherwise"
            )
        return np.asarray(ids, dtype=TOKEN_DTYPE)

    def _completion_ids(self, pieces: list[str]) -> np.ndarray:
        """The sampled ids, read back from the pieces of text the server reports per token."""
        ids = self.vocab.tokenize("".join(pieces).encode("utf-8"), add_bos=False, special=False)
        mine = [self.vocab.detokenize([i]).decode("utf-8", errors="ignore") for i in ids]
        if mine != pieces:
            first = next(
                (k for k, (a, b) in enumerate(zip(mine, pieces, strict=False)) if a != b),
                min(len(mine), len(pieces)),
            )
            raise UpstreamError(
                f"the completion's {len(pieces)} reported tokens do not tokenize back one to one "
                f"({len(ids)} tokens, the first difference at token {first}): its token ids "
                "cannot be recovered"
            )
        return np.asarray(ids, dtype=TOKEN_DTYPE)
