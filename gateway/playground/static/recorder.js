// Recording from the microphone (MediaRecorder) into a file the gateway takes. The gateway
// takes Ogg (Opus) but not WebM, and Chromium records WebM only (Firefox records Ogg): where
// Ogg/Opus cannot be recorded, the recording is decoded by the browser (an OfflineAudioContext,
// at the microphone's own rate) and written as 16-bit PCM WAV.

const OGG_OPUS = "audio/ogg;codecs=opus";
const FALLBACK_RATE = 48000;

// Whether this page can record at all: a secure context (https, or localhost) with a
// microphone API; elsewhere the button is not shown.
export function canRecord() {
  return Boolean(window.MediaRecorder && navigator.mediaDevices?.getUserMedia);
}

export class Recorder {
  constructor() {
    this.stream = null;
    this.recorder = null;
    this.chunks = [];
    this.started = 0;
  }

  get recording() {
    return this.recorder !== null;
  }

  get seconds() {
    return this.recording ? (performance.now() - this.started) / 1000 : 0;
  }

  // Asks for the microphone (the browser may ask the user) and starts recording.
  async start() {
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const type = MediaRecorder.isTypeSupported(OGG_OPUS) ? OGG_OPUS : "";
    this.recorder = new MediaRecorder(this.stream, type ? { mimeType: type } : {});
    this.chunks = [];
    this.recorder.addEventListener("dataavailable", (event) => this.chunks.push(event.data));
    this.recorder.start();
    this.started = performance.now();
  }

  // Stops, lets the microphone go, and gives the recording as a file the gateway takes:
  // {blob, type} with type "audio/ogg" or "audio/wav".
  async stop() {
    const recorder = this.recorder;
    const rate = this.stream.getAudioTracks()[0]?.getSettings().sampleRate || FALLBACK_RATE;
    const stopped = new Promise((resolve) => recorder.addEventListener("stop", resolve));
    recorder.stop();
    await stopped;
    this.stream.getTracks().forEach((track) => track.stop());
    this.recorder = null;
    this.stream = null;
    // (typed without the codecs parameter: the data: URI made of it declares audio/ogg)
    const ogg = recorder.mimeType.startsWith("audio/ogg");
    const recorded = new Blob(this.chunks, { type: ogg ? "audio/ogg" : recorder.mimeType });
    this.chunks = [];
    if (ogg) return { blob: recorded, type: "audio/ogg" };
    return { blob: await toWav(recorded, rate), type: "audio/wav" };
  }

  // Stops without keeping anything (a new chat, leaving the page).
  cancel() {
    if (!this.recorder) return;
    this.recorder.stop();
    this.stream.getTracks().forEach((track) => track.stop());
    this.recorder = null;
    this.stream = null;
    this.chunks = [];
  }
}

// The recording decoded (whatever the browser recorded it in) and written as WAV.
export async function toWav(blob, rate = FALLBACK_RATE) {
  const context = new OfflineAudioContext(1, 1, rate);
  const audio = await context.decodeAudioData(await blob.arrayBuffer());
  const channels = [];
  for (let c = 0; c < audio.numberOfChannels; c += 1) channels.push(audio.getChannelData(c));
  return new Blob([wavBytes(channels, audio.sampleRate)], { type: "audio/wav" });
}

// A RIFF/WAVE file of 16-bit PCM: `channels` are Float32Arrays of equal length in [-1, 1].
export function wavBytes(channels, rate) {
  const count = channels.length;
  const frames = channels[0].length;
  const dataBytes = frames * count * 2;
  const view = new DataView(new ArrayBuffer(44 + dataBytes));
  const ascii = (at, text) => [...text].forEach((ch, i) => view.setUint8(at + i, ch.charCodeAt(0)));
  ascii(0, "RIFF");
  view.setUint32(4, 36 + dataBytes, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true); // the fmt chunk's size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, count, true);
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * count * 2, true); // bytes per second
  view.setUint16(32, count * 2, true); // bytes per frame
  view.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  view.setUint32(40, dataBytes, true);
  let at = 44;
  for (let i = 0; i < frames; i += 1) {
    for (let c = 0; c < count; c += 1) {
      const x = Math.max(-1, Math.min(1, channels[c][i]));
      view.setInt16(at, x < 0 ? x * 0x8000 : x * 0x7fff, true);
      at += 2;
    }
  }
  return view.buffer;
}
