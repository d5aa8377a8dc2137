"""POST /v1/audio/transcriptions and /v1/audio/translations for Whisper-style models, answered
as vLLM 0.32's speech-to-text server answers them (vllm/entrypoints/speech_to_text/).

The gateway decodes the upload as that server does (`multimodal.audio_load`: 16 kHz mono,
libswresample), cuts it into 30 s clips at the quietest 100 ms before each mark
(`multimodal.audio_chunking`) and sends each clip to a worker that preprocesses media
(`mmgate engine --mm-processor inprocess`) as a float32 16 kHz WAV `data:` URL, which the
worker's vLLM reads back bit for bit and feeds its own Whisper processor without resampling
again; the decoder prompt travels as `tokenized.input_ids`. Without a `language`, one first
call on the first clip asks for a single greedy token restricted to the language tokens (a
metadata addition, protos/extensions.py, that only our engine takes).

The answer's shapes are vLLM's: `text` and `json` both answer JSON `{"text", "usage"}` (usage
only for transcriptions: the audio's whole seconds, rounded up), `verbose_json` the segments
cut at timestamp tokens, and `srt` and `vtt` a 400, as vLLM has them. Clip texts are joined
with a space (no space for Chinese and Japanese). A streamed answer sends the clips one after
another, each clip's first text after the first clip led by that separator.
"""

from __future__ import annotations

import asyncio
import io
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pybase64
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from gateway.api.audio import whisper
from gateway.api.audio.form import (
    AudioLimits,
    SpeechRequest,
    TranscriptionRequest,
    read_form,
)
from gateway.api.sampling import OPENAI_DEFAULTS, max_tokens_for
from gateway.errors import GatewayError, check_model
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.request_log import engine_request_id
from gateway.render.model_files import ModelFiles
from gateway.stream import sse
from gateway.stream.generation import Generation, per_choice
from gateway.stream.sse import ChunkWriter
from gateway.workers.pool import WorkerPool
from gateway.workers.worker import Worker
from multimodal.audio_chunking import split_audio
from multimodal.audio_decode import AudioDecodeError, AudioTooLarge
from multimodal.audio_load import load_audio
from protos import common_pb2, extensions
from protos import vllm_engine_pb2 as pb

Task = Literal["transcribe", "translate"]
_API = {"transcribe": "Transcriptions", "translate": "Translations"}
_CHUNK_OBJECT = {"transcribe": "transcription.chunk", "translate": "translation.chunk"}
BAD_AUDIO = (
    "Invalid or corrupted audio data. Ensure the input is a valid audio or video file "
    "(e.g. a complete WAV, MP3, or MP4)."
)
NO_DETECTION = (
    "detecting the language needs an engine worker that restricts sampling to given tokens "
    "(mmgate engine); pass `language`"
)


@dataclass
class _TextRequest:
    """What a Generation reads of a request: vLLM's speech-to-text sampling defaults."""

    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    n: int = 1
    spaces_between_special_tokens: bool = True
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    thinking_token_budget: int | None = None
    stop: list[str] = field(default_factory=list)

    def stop_list(self) -> list[str]:
        return self.stop


@dataclass(frozen=True)
class _Audio:
    clips: list[str]  # each clip as a data: URL
    starts: list[float]  # each clip's start, in seconds
    duration: float


class SpeechToTextService:
    def __init__(
        self,
        model_name: str,
        files: ModelFiles,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        task: Task,
        limits: AudioLimits | None = None,
    ) -> None:
        self.model_name, self.files, self.pool, self.metrics = model_name, files, pool, metrics
        self.task: Task = task
        self.limits = limits or AudioLimits.from_env()
        self.tokenizer = files.tokenizer
        self.supported = whisper.is_whisper(files.config)
        extractor = files.preprocessor
        self.rate = int(extractor.get("sampling_rate", 16000))
        self.clip_seconds = int(extractor.get("chunk_length", 30))
        self.hop = int(extractor.get("hop_length", 160))
        start = files.config.get("decoder_start_token_id")
        self.start_id = int(start) if start is not None else None

    async def create(self, request: Request) -> Response:
        if not self.supported:
            raise GatewayError(f"The model does not support the {_API[self.task]} API", 404)
        form_model = TranscriptionRequest if self.task == "transcribe" else SpeechRequest
        form, data = await read_form(request, form_model, self.limits)
        self._check(form)
        request_id = f"{self.task}-{engine_request_id(None)}"
        whisper.check_language(form.language)
        audio = await asyncio.to_thread(self._prepare, data)
        worker = self.pool.pick(media_refs=True)
        language = form.language or await self._detect(audio.clips[0], request_id, worker)
        verbose = form.response_format == "verbose_json"
        text = whisper.decoder_text(language, self.task, form.prompt, timestamps=verbose)
        ids = whisper.decoder_ids(self.tokenizer, text, self._start_id())
        params = self._sampling(form, worker, verbose)
        runs = [
            self._run(
                worker,
                request_id if len(audio.clips) == 1 else f"{request_id}-{k}",
                ids,
                clip,
                params,
                bool(form.stream),
            )
            for k, clip in enumerate(audio.clips)
        ]
        joiner = whisper.separator(language)
        if form.stream:
            return sse.event_stream(self._events(form, request_id, runs, audio, joiner))
        await asyncio.gather(*(run.run() for run in runs))
        return JSONResponse(self._body(form, language, runs, audio, joiner, verbose))

    def _check(self, form: SpeechRequest) -> None:
        """vLLM's refusals, in its order."""
        if form.stream and form.use_beam_search:
            raise GatewayError("Streaming is not currently supported with beam search", 400)
        check_model(form.model, self.model_name)
        if form.response_format not in ("text", "json", "verbose_json", "diarized_json"):
            raise GatewayError(
                "Currently only support response_format: `text`, `json`, `verbose_json` or "
                "`diarized_json`",
                400,
            )
        if form.response_format == "diarized_json":
            model = form.model or self.model_name
            raise GatewayError(f"Currently do not support diarized_json for {model}", 400)
        if form.response_format == "verbose_json" and form.stream:
            raise GatewayError("verbose_json format doesn't support streaming case", 400)
        # What vLLM takes and the wire cannot carry: refused rather than run differently.
        if form.use_beam_search:
            raise GatewayError("use_beam_search is not supported", 400, "use_beam_search")
        if form.vllm_xargs:
            raise GatewayError("vllm_xargs is not supported", 400, "vllm_xargs")

    def _start_id(self) -> int:
        if self.start_id is None:
            raise GatewayError("the model's config has no decoder_start_token_id", 500)
        return self.start_id

    def _prepare(self, data: bytes) -> _Audio:
        """Blocking: decode, cut and encode the clips."""
        try:
            samples = load_audio(
                data,
                self.rate,
                max_duration_s=self.limits.max_duration_s,
                max_decode_bytes=self.limits.max_decode_bytes,
            )
        except AudioTooLarge as error:
            raise GatewayError(f"Audio exceeds the allowed size: {error}", 400, "file") from None
        except AudioDecodeError:
            raise GatewayError(BAD_AUDIO, 400, "file") from None
        except Exception:  # noqa: BLE001 - whatever else the decoders raise: vLLM's 400
            raise GatewayError("Invalid or unsupported audio file.", 400, "file") from None
        duration = samples.shape[-1] / self.rate
        clips = (
            split_audio(samples, self.rate, self.clip_seconds)
            if duration > self.clip_seconds
            else [samples]
        )
        starts = [0.0]
        for clip in clips[:-1]:
            starts.append(starts[-1] + clip.shape[-1] / self.rate)
        return _Audio([_wav_url(c, self.rate) for c in clips], starts, duration)

    def _sampling(self, form: SpeechRequest, worker: Worker, verbose: bool) -> pb.SamplingParams:
        defaults = worker.facts.sampling_defaults
        # vLLM: as it calls get_max_tokens with no prompt length (the encoder's input is fixed).
        max_tokens = max_tokens_for(
            form.max_completion_tokens, 0, worker.facts.max_context_length, defaults
        )
        if max_tokens < 1:
            raise GatewayError(
                f"max_tokens must be at least 1, got {max_tokens}.", 400, "max_tokens"
            )
        if form.temperature < 0:
            raise GatewayError(
                f"temperature must be non-negative, got {form.temperature}.", 400, "temperature"
            )

        def chosen(name: str) -> Any:
            value = getattr(form, name)
            return value if value is not None else defaults.get(name, OPENAI_DEFAULTS[name])

        params = pb.SamplingParams(
            temperature=form.temperature,
            top_p=chosen("top_p"),
            top_k=max(chosen("top_k"), 0),
            min_p=chosen("min_p"),
            frequency_penalty=form.frequency_penalty or 0.0,
            presence_penalty=form.presence_penalty or 0.0,
            repetition_penalty=chosen("repetition_penalty"),
            max_tokens=max_tokens,
            skip_special_tokens=True,
            spaces_between_special_tokens=True,
            include_stop_str_in_output=form.include_stop_str_in_output,
            n=1,
        )
        if form.seed is not None:
            params.seed = form.seed
        if verbose:
            params.logprobs = 1  # the segments' avg_logprob
        return params

    def _run(
        self,
        worker: Worker,
        request_id: str,
        ids: list[int],
        clip: str,
        params: pb.SamplingParams,
        stream: bool,
        text: _TextRequest | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> Generation:
        generate = pb.GenerateRequest(
            request_id=request_id,
            tokenized=pb.TokenizedInput(input_ids=ids),
            media_refs=pb.MediaRefs(items=[pb.MediaRef(modality=common_pb2.AUDIO, url=clip)]),
            sampling_params=params,
            stream=stream,
        )
        return Generation(
            text or _TextRequest(),
            worker,
            generate,
            self.tokenizer,
            self.files.added_tokens,
            metrics=self.metrics,
            # A retry elsewhere needs the same addition: none for a call that carries one.
            reroute=None
            if metadata
            else lambda failed: self.pool.reroute(failed, prompt_ids=ids, media_refs=True),
            metadata=metadata,
        )

    async def _detect(self, clip: str, request_id: str, worker: Worker) -> str:
        """vLLM's language-detection pass: one greedy token after the start of transcript,
        among the language tokens, on the first clip."""
        if not worker.facts.takes_allowed_token_ids:
            raise GatewayError(NO_DETECTION, 400, "language")
        ids = whisper.decoder_ids(self.tokenizer, whisper.START_OF_TRANSCRIPT, self._start_id())
        params = pb.SamplingParams(temperature=0.0, max_tokens=1, n=1)
        allowed = whisper.language_token_ids(self.tokenizer)
        run = self._run(
            worker,
            f"{request_id}-lang_detect",
            ids,
            clip,
            params,
            stream=False,
            text=_TextRequest(skip_special_tokens=False),
            metadata=extensions.allowed_token_ids_metadata(allowed),
        )
        await run.run()
        named = run.choices[0].text.release(finished=True)
        token = self.tokenizer.token_to_id(named)
        if token is None:
            raise GatewayError(f"language detection answered {named!r}", 502)
        return whisper.detected_language(self.tokenizer, token)

    def _body(
        self,
        form: SpeechRequest,
        language: str,
        runs: list[Generation],
        audio: _Audio,
        joiner: str,
        verbose: bool,
    ) -> dict[str, Any]:
        if not verbose:
            text = joiner.join(run.choices[0].text.release(finished=True) for run in runs)
            if self.task == "translate":
                return {"text": text}
            return {"text": text, "usage": {"type": "duration", "seconds": _seconds(audio)}}
        first = whisper.decoder_ids(self.tokenizer, whisper.FIRST_TIMESTAMP, -1)[-1]
        eos = self.tokenizer.token_to_id(self.files.special_tokens.get("eos_token", ""))
        segments = []
        for run, start in zip(runs, audio.starts, strict=True):
            positions = run.choices[0].logprobs
            segments += whisper.segments(
                self.tokenizer,
                [p.token for p in positions],
                [p.logprob for p in positions],
                eos,
                start,
                form.temperature,
                first,
            )
        return {
            "duration": audio.duration,
            "language": language,
            "text": joiner.join(s["text"] for s in segments),
            "segments": segments,
            "words": None,
        }

    async def _events(
        self,
        form: SpeechRequest,
        request_id: str,
        runs: list[Generation],
        audio: _Audio,
        joiner: str,
    ) -> AsyncIterator[str]:
        """vLLM's stream: each clip's deltas in turn, then the usage when asked for."""
        model = form.model or self.model_name
        writer = ChunkWriter(request_id, _CHUNK_OBJECT[self.task], int(time.time()), model)
        audio_tokens = math.ceil(audio.duration * self.rate / self.hop)
        include_usage = bool(form.stream_include_usage)
        continuous = include_usage and bool(form.stream_continuous_usage_stats)
        prompt_tokens = completion_tokens = 0
        for k, run in enumerate(runs):
            beginning = True
            # In batches, as chat streams: a last chunk and its completion read together go
            # out as one event, the last token's text with the finish, as vLLM sends it.
            async for batch in run.batches():
                for choice, finished in per_choice(batch):
                    prompt_tokens = run.usage.prompt_tokens + audio_tokens
                    completion_tokens = sum(r.choices[0].generated for r in runs)
                    text = choice.text.release(finished=finished)
                    if k and beginning and text:
                        text, beginning = joiner + text, False
                    if not finished and not text:
                        continue
                    entry: dict[str, Any] = {"delta": {"content": text}}
                    if finished:
                        entry["finish_reason"] = choice.finish_reason
                        entry["stop_reason"] = choice.stop_reason
                    usage = _usage(prompt_tokens, completion_tokens) if continuous else None
                    yield writer.chunk([entry], usage)
        if include_usage:
            yield writer.chunk([], _usage(prompt_tokens, completion_tokens))


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def _seconds(audio: _Audio) -> int:
    return int(math.ceil(audio.duration))


def _wav_url(samples: npt.NDArray[np.floating], rate: int) -> str:
    """A clip as a float32 WAV data: URL: vLLM's loader reads these samples back exactly."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, np.asarray(samples, dtype=np.float32), rate, "FLOAT", format="WAV")
    return "data:audio/wav;base64," + pybase64.b64encode(buffer.getvalue()).decode("ascii")
