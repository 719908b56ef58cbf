// Reads the answers of `POST /v1/systemone` sent with `Accept: text/event-stream` as they land.
// `onAnswer(key, answer, stage)` runs for each answer the moment its stage is read; the promise resolves
// to what the JSON response would have held ({model, answers, usage, and skipped and warnings when sent}), or rejects
// with `error.body` set to the API's error body when the server ends the stream with an `error` event.

function parseBlock(block) {
  let name = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) name = line.slice("event: ".length);
    else if (line.startsWith("data: ")) data += line.slice("data: ".length);
  }
  return { name, data: data ? JSON.parse(data) : null };
}

export async function readAnswerStream(response, onAnswer = () => {}) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const payload = { answers: {} };
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the answer stream ended before its done event");
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const { name, data } = parseBlock(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
      if (name === "answer") {
        payload.answers[data.question] = data.answer;
        onAnswer(data.question, data.answer, data.stage);
      } else if (name === "done") {
        reader.cancel();
        const { request_id: _, ...rest } = data;
        return { ...rest, answers: payload.answers };
      } else if (name === "error") {
        reader.cancel();
        throw Object.assign(new Error("the server ended the answer stream with an error"), { body: data });
      }
    }
  }
}
