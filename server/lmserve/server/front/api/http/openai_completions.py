"""A `/v1/completions` request carried out by the gRPC servicer's own Generate and Score, its
answers put in OpenAI's shape.

    steps = CompletionSteps([prompt_steps(servicer, body, i, p) for i, p in enumerate(prompts)])
    await steps.start()                    # each prompt's first answer: the servicer's refusals
    async for step in steps.iterate():     # (choice index, Piece) pairs, as the tokens come
        delta = choices[index].add(piece)  # a streamed chunk's choice; `.result()` at the end

Choice `i * n + k` is sample k of prompt i. Each prompt is one Generate call, all running at once
(the engine batches them). `echo` puts the prompt before the completion with the
log-probabilities Score gives for it (no `</s>`); with `logprobs` N, each echoed position's
N alternatives come from a one-token greedy Generate of the prompt's prefix (one position after
another, so a long prompt holds one generation slot: lm-evaluation-harness's greedy check reads
them), the echoed token's own entry
holding Score's value so the two agree exactly. Token texts are what each token adds to the text
(spacing included), so `tokens` joins into `text` and `text_offset` points into it; the keys
of `top_logprobs` are the alternatives' vocabulary entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TypedDict, cast

from lmserve.server.decoding.detokenize import detokenize
from lmserve.server.front.api.generation import prompt_ids
from lmserve.server.front.api.http.openai_schema import CompletionRequest, generate_request
from lmserve.server.front.api.model_use import use_model
from lmserve.server.front.api.servicer import LanguageModelServicer, NoDeadline
from lmserve.v1 import lm_service_pb2 as pb

FINISH_REASONS = {
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_END_OF_SENTENCE: "stop",
    pb.FINISH_REASON_CANCELLED: "abort",  # vLLM's name; Generate raises on a passed deadline
}
# Steps a prompt may run ahead of the writer before its Generate waits (and, past the engine's
# own bound, has its sequences parked): a slow reader slows the generation, never buffers it.
_AHEAD = 16


@dataclass(slots=True)
class Piece:
    """What one message adds to one choice: text, its tokens (offsets from the piece's start),
    and when the choice ends, why and its usage."""

    text: str = ""
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0  # counted on one choice of each prompt
    completion_tokens: int = 0
    # Put between this piece and the next text (an echoed prompt and its completion's words).
    separator: str = ""


Step = list[tuple[int, Piece]]


class Logprobs(TypedDict):
    """A choice's `logprobs` object: OpenAI's four parallel lists."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChoiceObject(TypedDict):
    """One choice of a completion (or of a streamed chunk: its delta)."""

    index: int
    text: str
    logprobs: Logprobs | None
    finish_reason: str | None


class Choice:
    """One choice as it grows: `add` answers the streamed delta, `result` the whole choice."""

    def __init__(self, index: int, logprobs: bool) -> None:
        self.index = index
        self._logprobs = logprobs
        self._text: list[str] = []
        self._length = 0
        self._lists: Logprobs = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        self.finish_reason: str | None = None
        self._separator = ""

    def add(self, piece: Piece) -> ChoiceObject:
        text, start = piece.text, self._length
        if text and self._separator:
            text, start = self._separator + text, start + len(self._separator)
            self._separator = ""
        self._separator = piece.separator or self._separator
        lists: Logprobs = {
            "tokens": piece.tokens,
            "token_logprobs": piece.token_logprobs,
            "top_logprobs": piece.top_logprobs,
            "text_offset": [start + offset for offset in piece.offsets],
        }
        self._text.append(text)
        self._length += len(text)
        self._lists["tokens"].extend(lists["tokens"])
        self._lists["token_logprobs"].extend(lists["token_logprobs"])
        self._lists["top_logprobs"].extend(lists["top_logprobs"])
        self._lists["text_offset"].extend(lists["text_offset"])
        self.finish_reason = piece.finish_reason or self.finish_reason
        return self._choice(text, lists, piece.finish_reason)

    def result(self) -> ChoiceObject:
        return self._choice("".join(self._text), self._lists, self.finish_reason)

    def _choice(self, text: str, lists: Logprobs, finish_reason: str | None) -> ChoiceObject:
        return {
            "index": self.index,
            "text": text,
            "logprobs": lists if self._logprobs else None,
            "finish_reason": finish_reason,
        }


@dataclass
class EndToken:
    """How a sample's `</s>` shows in its logprobs (OpenAI lists the end-of-text token it
    generated in `tokens` while its text leaves it out): the model's end token, and the
    log-probabilities of each sample's tokens so far (its `</s>`'s is the rest of its total)."""

    text: str
    sums: dict[int, float] = field(default_factory=dict)


def token_step(message: pb.GenerateResponse, first: int, end: EndToken | None = None) -> Step:
    """One Generate message as pieces of the choices it touches (`first`: sample 0's choice).
    With `end` (logprobs asked for), a sample that ended at `</s>` lists it as its last token."""
    pieces: dict[int, Piece] = {}
    for token in message.tokens:
        piece = pieces.get(token.sample_index)
        if piece is None:
            piece = pieces[token.sample_index] = Piece()
        piece.offsets.append(len(piece.text))
        piece.text += token.text
        piece.tokens.append(token.text)
        piece.token_logprobs.append(finite(token.log_prob))
        piece.top_logprobs.append({alt.text: finite(alt.log_prob) for alt in token.top_logprobs})
        if end is not None:
            end.sums[token.sample_index] = end.sums.get(token.sample_index, 0.0) + token.log_prob
    if message.HasField("finished"):
        done = message.finished
        piece = pieces.get(done.sample_index)
        if piece is None:
            piece = pieces[done.sample_index] = Piece()
        if end is not None and done.reason == pb.FINISH_REASON_END_OF_SENTENCE:
            log_prob = done.log_prob - end.sums.get(done.sample_index, 0.0)
            piece.offsets.append(len(piece.text))
            piece.tokens.append(end.text)
            piece.token_logprobs.append(finite(log_prob))
            piece.top_logprobs.append({end.text: finite(log_prob)})
        piece.finish_reason = FINISH_REASONS.get(done.reason, "stop")
        piece.completion_tokens = done.usage.generated_tokens
        piece.prompt_tokens = done.usage.prompt_tokens if done.sample_index == 0 else 0
    return [(first + sample, piece) for sample, piece in pieces.items()]


def finite(log_prob: float) -> float:
    """JSON has no infinities: an impossible token's log-probability as vLLM writes it."""
    return max(log_prob, -9999.0)


def _offsets(text: str, tokens: list[str]) -> list[int]:
    """Where each scored token starts in the prompt (tokens may be lowercased or OOV words);
    a token not found where expected starts where the previous one ended."""
    lowered = text.lower()
    haystack = lowered if len(lowered) == len(text) else text
    offsets, at = [], 0
    for token in tokens:
        found = haystack.find(token.lower(), at) if token else -1
        start = at if found < 0 else found
        offsets.append(start)
        at = start + len(token) if found >= 0 else at
    return offsets


async def echo_piece(
    servicer: LanguageModelServicer,
    body: CompletionRequest,
    prompt: str | list[int],
    separator: str,
) -> Piece:
    """The prompt as a choice's start: its text (`separator` goes before the completion's
    text) and, with `logprobs`, its tokens scored by Score exactly (`</s>` not added).

    A prompt of token ids (what evaluation clients send after `/tokenize`) is scored on exactly
    those ids, as vLLM scores them (`_id_prompt` says how its first id is read)."""
    if isinstance(prompt, list):
        echo = _id_prompt(servicer, body.model, prompt)
    else:
        echo = EchoedPrompt(pb.ScoreRequest(texts=[prompt]), prompt, [], [])
    text, start = echo.text, echo.start
    piece = Piece(text=text, separator=separator if text and not text[-1].isspace() else "")
    if not prompt or (body.logprobs is None and body.max_tokens != 0):
        return piece  # nothing to score, or nothing asked of the score
    score_request = echo.request
    score_request.model = body.model
    score_request.return_tokens = body.logprobs is not None
    score_request.options.eos = False
    answer = await servicer.Score(score_request, NoDeadline())
    [result] = pb.ScoreResponse.FromString(answer).results
    details = result.details
    piece.prompt_tokens = result.token_count + len(start)
    piece.tokens = [*start, *details.tokens]
    piece.token_logprobs = [None] * len(start) + [finite(lp) for lp in details.log_probs]
    piece.top_logprobs = [None] * len(piece.tokens)
    if body.logprobs:
        # One position after another: a long prompt must not take every generation slot.
        piece.top_logprobs = [None] * len(start) + [
            await _alternatives(
                servicer, body.model, [*echo.start_ids, *details.token_ids[:i]], body.logprobs
            )
            for i in range(len(details.tokens))
        ]
        pairs = zip(piece.tokens, piece.token_logprobs, strict=True)
        for i, (token, log_prob) in enumerate(pairs):
            top = piece.top_logprobs[i]
            if top is not None and token in top and log_prob is not None:
                top[token] = log_prob  # Score's value: the same number as token_logprobs
    piece.offsets = _offsets(text, piece.tokens)
    return piece


@dataclass
class EchoedPrompt:
    """A prompt to echo: the Score request of its scored tokens, its text, and the tokens
    echoed before them with no log-prob (`start`, as text and as ids)."""

    request: pb.ScoreRequest
    text: str
    start: list[str]
    start_ids: list[int]


def _id_prompt(servicer: LanguageModelServicer, model: str, ids: list[int]) -> EchoedPrompt:
    """A token-id prompt scored on exactly its ids, nothing added (vLLM's convention):

    - a leading `<s>` id is the start the rest is read from (as every text is), echoed with a
      null log-prob;
    - else a model that reads every text from `<s>` (n-gram, recurrent) scores the first id
      given `<s>`;
    - else (a transformer) the first id is the context the rest is read from, echoed with a
      null log-prob: nothing comes before it to predict it from."""
    with use_model(servicer.models, model) as served:
        vocab = served.vocab
        ids = prompt_ids(ids, len(vocab), field="prompt")
        text = detokenize(served.detokenizer()(), ids[1:] if ids[:1] == [vocab.bos_id] else ids)
        if ids[:1] == [vocab.bos_id]:
            scored, bos, first = ids[1:], True, [vocab.words[vocab.bos_id]]
        elif served.reads_from_start or not ids:
            scored, bos, first = ids, True, []
        else:
            scored, bos, first = ids, False, [served.token_texts[ids[0]]]
    request = pb.ScoreRequest(token_ids=[pb.TokenIds(ids=scored)], options=pb.ScoreOptions(bos=bos))
    return EchoedPrompt(request, text, first, ids[: len(first)])


async def _alternatives(
    servicer: LanguageModelServicer, model: str, context: Sequence[int], count: int
) -> dict[str, float]:
    """The `count` most probable next tokens after `context` (from `<s>`): one greedy Generate
    step, whose top alternatives are the model's own distribution."""
    request = pb.GenerateRequest(
        model=model,
        prompt_token_ids=context,
        sampling=pb.SamplingParams(temperature=0.0),
        stopping=pb.StoppingCriteria(max_new_tokens=1, ignore_eos=True),
        logprobs=True,
        top_logprobs=count,
    )
    messages = generate_messages(servicer, request)
    async with contextlib.aclosing(messages):
        async for message in messages:
            for token in message.tokens:
                return {alt.text: finite(alt.log_prob) for alt in token.top_logprobs}
    return {}


async def prompt_steps(
    servicer: LanguageModelServicer,
    body: CompletionRequest,
    index: int,
    prompt: str | list[int],
    separator: str,
) -> AsyncGenerator[Step, None]:
    """The steps of prompt `index`: its echo (when asked), then its Generate stream. Generate
    is started first, so a request it refuses is refused before anything is echoed."""
    first = index * body.n
    generating = body.max_tokens != 0
    messages: AsyncGenerator[pb.GenerateResponse, None] | None = None
    if generating:
        messages = generate_messages(servicer, generate_request(body, prompt))
    async with contextlib.AsyncExitStack() as stack:
        head = None
        if messages is not None:
            stack.push_async_callback(messages.aclose)
            head = await anext(messages)
        if body.echo:
            piece = await echo_piece(servicer, body, prompt, separator)
            if generating:
                piece.prompt_tokens = 0  # Generate's usage counts the prompt
            else:
                piece.finish_reason = "length"
            yield [(first, piece)] + [(first + k, _without_usage(piece)) for k in range(1, body.n)]
        if head is not None and messages is not None:
            end = None
            if body.logprobs is not None:
                with use_model(servicer.models, body.model) as served:
                    end = EndToken(served.vocab.words[served.vocab.eos_id])
                    context = prompt if isinstance(prompt, list) else served.encode_prompt(prompt)
            history: dict[int, list[int]] = {}
            async for message in _chain(head, messages):
                step = token_step(message, first, end)
                if end is not None and body.logprobs:
                    ended = dict(step).get(first + message.finished.sample_index)
                    await _end_alternatives(servicer, body, message, ended, end, context, history)
                yield step


async def _chain(
    head: pb.GenerateResponse, rest: AsyncGenerator[pb.GenerateResponse, None]
) -> AsyncGenerator[pb.GenerateResponse, None]:
    yield head
    async for message in rest:
        yield message


async def _end_alternatives(
    servicer: LanguageModelServicer,
    body: CompletionRequest,
    message: pb.GenerateResponse,
    piece: Piece | None,
    end: EndToken,
    context: list[int],
    history: dict[int, list[int]],
) -> None:
    """The top alternatives at a sample's `</s>` (the model's distribution after its prompt and
    tokens), as every other position has them; `history` keeps each sample's tokens."""
    for token in message.tokens:
        history.setdefault(token.sample_index, []).append(token.token_id)
    if not message.HasField("finished") or piece is None:
        return
    done = message.finished
    if done.reason != pb.FINISH_REASON_END_OF_SENTENCE or not piece.tokens:
        return
    count = body.logprobs or 1
    ids = [*context, *history.get(done.sample_index, [])]
    # `_alternatives` steps with `</s>` banned: its own value (the same number as
    # token_logprobs) joins them, and the `count` best are kept.
    top = await _alternatives(servicer, body.model, ids, count)
    log_prob = piece.token_logprobs[-1]
    if log_prob is not None:
        top[end.text] = log_prob
    best = sorted(top.items(), key=lambda item: -item[1])[:count]
    piece.top_logprobs[-1] = dict(best)


def _without_usage(piece: Piece) -> Piece:
    return dataclasses.replace(piece, prompt_tokens=0, completion_tokens=0)


class CompletionSteps:
    """Every prompt's steps, merged in arrival order."""

    def __init__(self, sources: list[AsyncGenerator[Step, None]]) -> None:
        self._sources = sources
        self._firsts: list[Step | None] = []

    async def start(self) -> None:
        """Waits for each prompt's first step: a refused request fails here, before an answer
        has begun; the other prompts are then stopped."""

        async def first(source: AsyncGenerator[Step, None]) -> Step | None:
            return await anext(source, None)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(first(source)) for source in self._sources]
        except BaseExceptionGroup as failed:
            await self.aclose()
            raise failed.exceptions[0] from None
        except BaseException:  # cancelled: the client left
            await self.aclose()
            raise
        self._firsts = [task.result() for task in tasks]

    async def aclose(self) -> None:
        for source in self._sources:
            await source.aclose()

    async def iterate(self) -> AsyncGenerator[Step, None]:
        """The steps, after `start`; closing it early stops every prompt's generation."""
        tasks: list[asyncio.Task[None]] = []
        try:
            for step in self._firsts:
                if step is not None:
                    yield step
            if len(self._sources) == 1:
                async for step in self._sources[0]:
                    yield step
                return
            queue: asyncio.Queue[Step | Exception | None] = asyncio.Queue(_AHEAD)
            tasks = [asyncio.create_task(_pump(source, queue)) for source in self._sources]
            running = len(tasks)
            while running:
                item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()  # each closes its prompt's steps (and so its Generate)
            if not tasks:
                await self.aclose()  # closing Generate cancels the generation


async def _pump(
    source: AsyncGenerator[Step, None], queue: asyncio.Queue[Step | Exception | None]
) -> None:
    """One prompt's steps into the shared queue, then None (or what it raised)."""
    try:
        async with contextlib.aclosing(source):
            async for step in source:
                await queue.put(step)
        await queue.put(None)
    except Exception as exc:
        await queue.put(exc)


async def generate_messages(
    servicer: LanguageModelServicer, request: pb.GenerateRequest
) -> AsyncGenerator[pb.GenerateResponse, None]:
    """Generate's messages parsed from the wire bytes the engine built: the one place this
    front reads them, since it speaks JSON."""
    stream = cast(AsyncGenerator[bytes, None], servicer.Generate(request, NoDeadline()))
    async with contextlib.aclosing(stream):
        async for data in stream:
            yield pb.GenerateResponse.FromString(data)
