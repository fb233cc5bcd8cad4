"""The body of `POST /v1/completions`, checked for shape and turned into `GenerateRequest`s.

    body = parse_completion(raw_bytes)           # InvalidArgument naming the field
    request = generate_request(body, prompt)     # one per prompt; the servicer validates it

Only the body's shape is checked here (types, unknown or unsupported fields, the proto's integer
widths): every range and limit is the servicer's, so an OpenAI caller is refused exactly where a
gRPC caller would be. `param_of` names a servicer error's proto field as the OpenAI parameter.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lmserve.server.errors import InvalidArgument
from lmserve.v1 import lm_service_pb2 as pb

# The proto's integer widths: a value outside one cannot be put in the message at all.
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
# OpenAI seeds are signed 64-bit; the proto's is unsigned: a negative seed is its two's complement.
Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]
Prompt = str | list[str] | list[Int32] | list[list[Int32]]

# Proto field (as the servicer's errors name it) -> the OpenAI parameter it came from.
_PARAMS = {
    "stopping.max_new_tokens": "max_tokens",
    "stopping.min_new_tokens": "min_tokens",
    "top_logprobs": "logprobs",
    "prompt_token_ids": "prompt",
    "texts": "prompt",
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class CompletionRequest(BaseModel):
    """OpenAI's legacy completions body, with vLLM's sampling extras. None means "not sent":
    the servicer's default applies (OpenAI's defaults are the same ones)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: Prompt
    max_tokens: Int32 | None = 16
    temperature: float | None = None
    top_p: float | None = None
    n: Annotated[int, Field(ge=1, le=2**31 - 1)] = 1  # the proto reads 0 as 1; OpenAI refuses it
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: Int32 | None = None
    echo: bool = False
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: Seed | None = None
    user: str | None = None  # accepted; nothing is done with it
    # Named by OpenAI, not offered: refused unless left at their no-op values.
    suffix: str | None = None
    best_of: Int32 | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extras.
    top_k: Int32 | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: Int32 | None = None
    stop_token_ids: list[Int32] | None = None

    @model_validator(mode="after")
    def _offered(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix: is not supported (these models only continue text)")
        if self.best_of is not None and self.best_of != 1:
            raise ValueError("best_of: is not supported; use n for several samples")
        if self.logit_bias:
            raise ValueError("logit_bias: is not supported")
        if self.prompt == [] or self.prompt == [[]]:
            raise ValueError("prompt: is empty; send a string, a list of strings or token ids")
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 only with echo (to score the prompt); send >= 1")
        return self

    def text_prompts(self) -> bool:
        return isinstance(self.prompt, str) or isinstance(self.prompt[0], str)

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one Generate each: texts, or token-id lists."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        return (
            [[i for i in prompt if isinstance(i, int)]]
            if isinstance(prompt[0], int)
            else [p for p in prompt if not isinstance(p, int)]
        )


_FIELDS = tuple(CompletionRequest.model_fields)


def parse_completion(raw: bytes) -> CompletionRequest:
    """The checked body; InvalidArgument names the first problem and how to fix it."""
    try:
        return CompletionRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: ValidationError) -> InvalidArgument:
    error = exc.errors(include_url=False)[0]
    loc, kind = error["loc"], error["type"]
    field = str(loc[0]) if loc else "body"
    if field == "stream_options" and len(loc) > 1 and loc[1] in StreamOptions.model_fields:
        field = f"stream_options.{loc[1]}"
    if kind == "json_invalid":
        return InvalidArgument("body", f"is not JSON ({error['msg']}); send a JSON object")
    if kind == "model_type":
        return InvalidArgument(field, "must be a JSON object")
    if kind == "extra_forbidden":
        if len(loc) > 1:  # inside stream_options
            field = ".".join(str(part) for part in loc)
            return InvalidArgument(field, "is not an option; stream_options takes include_usage")
        offered = ", ".join(_FIELDS)
        return InvalidArgument(field, f"is not a field /v1/completions takes; it takes {offered}")
    if kind == "missing":
        return InvalidArgument(field, "is required")
    if kind == "value_error":  # from _offered: "field: problem"
        field, _, problem = str(error["ctx"]["error"]).partition(": ")
        return InvalidArgument(field, problem)
    if field == "prompt":
        return InvalidArgument(
            field, "must be a string, a list of strings, a list of token ids or a list of them"
        )
    if field == "stop":
        return InvalidArgument(field, "must be a string or a list of strings")
    return InvalidArgument(field, f"{error['msg']}, got {error.get('input')!r}")


def generate_request(body: CompletionRequest, prompt: str | list[int]) -> pb.GenerateRequest:
    """The Generate request of one prompt (`max_tokens` >= 1; echo alone needs none)."""
    # An unset field (None) stays unset in the message: the servicer's default applies.
    sampling = pb.SamplingParams(
        temperature=body.temperature,
        top_p=body.top_p,
        min_p=body.min_p,
        typical_p=body.typical_p,
        repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        top_k=None if body.top_k is None else 0 if body.top_k == -1 else body.top_k,  # vLLM's -1
        seed=None if body.seed is None else body.seed % 2**64,
    )
    stop = [body.stop] if isinstance(body.stop, str) else body.stop or []
    request = pb.GenerateRequest(
        model=body.model,
        sampling=sampling,
        stopping=pb.StoppingCriteria(
            max_new_tokens=body.max_tokens or 16,
            min_new_tokens=body.min_tokens or 0,
            stop=stop,
            stop_token_ids=body.stop_token_ids or [],
            ignore_eos=body.ignore_eos,
        ),
        n=body.n,
        logprobs=body.logprobs is not None,
        top_logprobs=body.logprobs or 0,
    )
    if isinstance(prompt, str):
        request.prompt = prompt
    else:
        request.prompt_token_ids.extend(prompt)
    return request


def param_of(exc: BaseException | None) -> str | None:
    """The OpenAI parameter a servicer error names (`sampling.top_p` -> `top_p`), or None."""
    field = getattr(exc, "field", None)
    if not isinstance(field, str) or not field:
        return None
    base = field.split("[", 1)[0]
    if base in _PARAMS:
        return _PARAMS[base]
    return base.removeprefix("sampling.").removeprefix("stopping.")
