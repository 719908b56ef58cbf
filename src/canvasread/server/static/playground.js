// The canvasread playground: builds a System One request, sends it to the same
// /v1/systemone route clients use, and draws each answer's distribution.
// Plain ES module, no build step, no network beyond this server.

import { readAnswerStream } from "./stream.js";

// Each example leads with what the embedded default (sparrow) does well and says
// what was measured on it (bench/results/README.md); the notes name sparrow
// because other models score differently.
const TEAMS = {
  billing: "charges, invoices, refunds, payments",
  technical: "bugs, crashes, error messages, outages",
  shipping: "deliveries, parcels, tracking, delivery addresses",
  account: "login, passwords, profile and account settings, deleting the account",
  sales: "prices, plans, quotes and trials for new purchases",
};

const EXAMPLES = [
  {
    name: "Route a ticket",
    note: "Choice is what the embedded sparrow model does best: it routes 18 of 20 hand-written tickets to the right team. Its scores are rougher: 9 of 15 product reviews get the right tone.",
    state: "I was charged twice for order 1182 and nobody answers my emails. I want my money back today!",
    questions: {
      team: { type: "choice", instructions: "Which team should handle this ticket?", criteria: TEAMS },
      tone: { type: "score", instructions: "How positive is the customer?", criteria: ["negative", "neutral", "positive"] },
    },
  },
  {
    name: "Ticket as JSON",
    note: "The state can be any JSON value. On the same tickets wrapped in JSON sparrow routes 15 of 20 right (18 of 20 as plain text).",
    state: { channel: "email", customer: "C-1042", order: 5521, message: "The tracking link says delivered, but there is no parcel at my door." },
    questions: {
      team: { type: "choice", instructions: "Which team should handle the `message`?", criteria: TEAMS },
    },
  },
  {
    name: "Pipeline (stages)",
    note: "Questions with depends_on or ask_if are read in stages and their answers are drawn as each stage lands. The second question is asked only for billing tickets, the third only for shipping ones (skipped here). It shows how stages run; sparrow's answers to the follow-up questions were not measured.",
    state: "I was charged twice for order 1182 and nobody answers my emails. I want my money back today!",
    questions: {
      team: { type: "choice", instructions: "Which team should handle this ticket?", criteria: TEAMS },
      billing_issue: {
        type: "choice",
        instructions: "What is the billing problem?",
        criteria: { "double charge": null, "wrong amount": null, "missing invoice": null },
        ask_if: { team: ["billing"] },
      },
      parcel_issue: {
        type: "choice",
        instructions: "What happened to the parcel?",
        criteria: { late: null, lost: null, damaged: null },
        ask_if: { team: ["shipping"] },
      },
    },
  },
  {
    name: "Yes/no (needs a real model)",
    note: "This shows a yes/no request. The embedded sparrow model answers yes/no at about chance (0.58 accuracy on 616 balanced Banking77 questions, where a coin scores 0.5): expect wrong answers here and serve a real model for yes/no.",
    state: "Limited offer!!! Click here to claim your free crypto before it's gone.",
    questions: {
      spam: {
        type: "noul",
        instructions: "Is this message spam?",
        criteria: { true: "unsolicited advertising or scams", false: null },
      },
    },
  },
];

const $ = (selector, root = document) => root.querySelector(selector);
const $$ = (selector, root = document) => [...root.querySelectorAll(selector)];

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "style") Object.assign(node.style, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(key, value === true ? "" : value);
  }
  node.append(...children.flat(Infinity).filter((child) => child !== null && child !== undefined));
  return node;
}

// JSON values (descriptions, legend entries) shown as text.
const asText = (value) => (value === null || value === undefined ? "" : typeof value === "string" ? value : JSON.stringify(value));
const fixed = (value, digits = 3) => (typeof value === "number" ? value.toFixed(digits) : "–");

// ---- composing questions ---------------------------------------------------------------

let nextQuestion = 1;

// The question kinds this server knows, learned from its schema (/openapi.json), each with the shape of its
// criteria: "sides" (named sides, a noul's true and false), "options" (named options with descriptions),
// "levels" (an ordered list), or null (no criteria: the instructions say it all).
let KINDS = {};

function criteriaShape(question, components) {
  const criteria = question.properties?.criteria;
  const resolve = (schema) => (schema.$ref ? components[schema.$ref.split("/").pop()] : schema);
  const [shape] = (criteria?.anyOf || (criteria ? [criteria] : [])).map(resolve).filter((s) => s.type && s.type !== "null");
  if (!shape) return { form: null };
  if (shape.type === "array") return { form: "levels" };
  if (shape.type === "object" && shape.properties) return { form: "sides", sides: Object.keys(shape.properties) };
  return shape.type === "object" ? { form: "options" } : { form: null };
}

async function loadKinds() {
  const response = await fetch("openapi.json", { headers: headers() });
  if (!response.ok) throw new Error(`GET /openapi.json answered HTTP ${response.status}`);
  const components = (await response.json()).components.schemas;
  const union = components.SystemOneRequest.properties.questions.additionalProperties;
  const refs = union.oneOf.map((entry) => entry.$ref.split("/").pop());
  KINDS = Object.fromEntries(refs.map((ref) => [components[ref].properties.type.const, criteriaShape(components[ref], components)]));
  $(".adders").replaceChildren(...Object.keys(KINDS).map((kind) => el("button", { type: "button", dataset: { add: kind }, onclick: () => addQuestion(kind) }, `+ ${kind}`)));
}

const formOf = (kind) => KINDS[kind]?.form ?? null;

function optionRow(form, name = "", description = "") {
  const remove = el("button", { type: "button", class: "icon", title: "Remove", "aria-label": "remove option" }, "×");
  const named = form === "options";
  const row = el(
    "div",
    { class: "option-row" },
    named
      ? el("input", { class: "option-name", placeholder: "label", value: name, "aria-label": "option label" })
      : el("span", { class: "level-index" }),
    el("input", {
      class: "option-description",
      placeholder: named ? "description (optional)" : "level description",
      value: asText(description),
      "aria-label": named ? "option description" : "level",
    }),
    remove,
  );
  remove.addEventListener("click", () => {
    const list = row.parentElement;
    row.remove();
    renumber(list);
  });
  return row;
}

function renumber(list) {
  $$(".level-index", list).forEach((span, index) => (span.textContent = String(index)));
}

function criteriaEditor(kind, criteria) {
  const form = formOf(kind);
  if (form === null) return el("div", { class: "criteria" });
  if (form === "sides") {
    const given = criteria || {};
    return el(
      "div",
      { class: "criteria sides-criteria" },
      KINDS[kind].sides.map((side) =>
        el("label", {}, `${side} means `, el("input", { class: "side", dataset: { side }, placeholder: "optional", value: asText(given[side]) })),
      ),
    );
  }
  const list = el("div", { class: "option-list" });
  const blank = [["", null], ["", null]];
  const entries = form === "options" ? (criteria ? Object.entries(criteria) : blank) : criteria ? criteria.map((d) => ["", d]) : blank;
  for (const [name, description] of entries) list.append(optionRow(form, name, description));
  renumber(list);
  const add = el("button", { type: "button", class: "link" }, form === "options" ? "+ option" : "+ level");
  add.addEventListener("click", () => {
    list.append(optionRow(form));
    renumber(list);
  });
  return el("div", { class: `criteria ${form}-criteria` }, list, add);
}

// Keys a card has no field for (depends_on, ask_if, alone, min_confidence...) are edited as one JSON object.
const CARD_KEYS = new Set(["type", "instructions", "criteria"]);

function extensionKeys(question) {
  const extra = Object.fromEntries(Object.entries(question).filter(([key]) => !CARD_KEYS.has(key)));
  return Object.keys(extra).length ? JSON.stringify(extra) : "";
}

function questionCard(id, question) {
  const kind = question.type;
  const type = el(
    "select",
    { class: "question-type", "aria-label": "question type" },
    ...Object.keys(KINDS).map((k) => el("option", { value: k, selected: k === kind }, k)),
  );
  const remove = el("button", { type: "button", class: "icon", title: "Remove question", "aria-label": "remove question" }, "×");
  const card = el(
    "div",
    { class: "question", dataset: { kind } },
    el(
      "div",
      { class: "question-head" },
      el("input", { class: "question-id", value: id, "aria-label": "question id", spellcheck: "false" }),
      type,
      remove,
    ),
    el("textarea", { class: "instructions", rows: "1", placeholder: "instructions", "aria-label": "instructions" }, asText(question.instructions)),
    criteriaEditor(kind, question.criteria),
    el("input", {
      class: "question-extra",
      value: extensionKeys(question),
      placeholder: 'extension keys (JSON), e.g. {"depends_on": ["team"]}',
      "aria-label": "extension keys",
      spellcheck: "false",
    }),
  );
  type.addEventListener("change", () => {
    card.dataset.kind = type.value;
    $(".criteria", card).replaceWith(criteriaEditor(type.value));
  });
  remove.addEventListener("click", () => card.remove());
  return card;
}

function addQuestion(kind) {
  const card = questionCard(`q${nextQuestion++}`, { type: kind });
  $("#questions").append(card);
  $(".instructions", card).focus();
}

function readQuestion(card) {
  const kind = card.dataset.kind;
  const question = { type: kind };
  const instructions = $(".instructions", card).value.trim();
  if (instructions) question.instructions = instructions;
  const form = formOf(kind);
  if (form === "sides") {
    const sides = $$(".side", card).map((input) => [input.dataset.side, input.value.trim() || null]);
    if (sides.some(([, text]) => text)) question.criteria = Object.fromEntries(sides);
  } else if (form === "options") {
    question.criteria = Object.fromEntries(
      $$(".option-row", card).map((row) => [$(".option-name", row).value.trim(), $(".option-description", row).value.trim() || null]),
    );
  } else if (form === "levels") {
    question.criteria = $$(".option-description", card).map((input) => input.value.trim());
  }
  const extra = $(".question-extra", card).value.trim();
  if (!extra) return question;
  const keys = JSON.parse(extra);
  if (keys === null || typeof keys !== "object" || Array.isArray(keys)) throw new SyntaxError("not a JSON object");
  return { ...keys, ...question };
}

function loadExample(example) {
  clearResult(START_MESSAGE);
  $("#example-note").textContent = example.note;
  const json = typeof example.state !== "string";
  $(`input[name=state-kind][value=${json ? "json" : "text"}]`).checked = true;
  $("#state").value = json ? JSON.stringify(example.state, null, 2) : example.state;
  $("#questions").replaceChildren(...Object.entries(example.questions).map(([id, q]) => questionCard(id, q)));
  nextQuestion = Object.keys(example.questions).length + 1;
}

// ---- sending ---------------------------------------------------------------------------

function headers() {
  const key = $("#api-key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function buildBody() {
  const stateText = $("#state").value;
  let state = stateText;
  if ($("input[name=state-kind]:checked").value === "json") {
    try {
      state = JSON.parse(stateText);
    } catch (error) {
      clearResult("Not sent.");
      showError("The state is not valid JSON", [{ text: error.message }]);
      return null;
    }
  }
  const body = { model: $("#model").value || "jev-latest", state, questions: {} };
  for (const card of $$(".question")) {
    const id = $(".question-id", card).value.trim();
    try {
      body.questions[id] = readQuestion(card);
    } catch (error) {
      clearResult("Not sent.");
      card.classList.add("invalid");
      showError(`The extension keys of ${id} are not a JSON object`, [{ text: error.message }]);
      return null;
    }
  }
  if ($("#diagnostics").checked) body.diagnostics = true;
  const samples = $("#samples").value.trim();
  if (samples) body.samples = /^\d+$/.test(samples) ? Number(samples) : samples;
  const seed = $("#seed").value.trim();
  if (seed) body.seed = /^-?\d+$/.test(seed) ? Number(seed) : seed;
  return body;
}

async function send() {
  const body = buildBody();
  if (!body) return;
  const button = $("#send");
  button.disabled = true;
  $("#result").classList.add("busy");
  $("#request-json").textContent = JSON.stringify(body, null, 2);
  const started = performance.now();
  try {
    const response = await fetch("v1/systemone", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream", ...headers() },
      body: JSON.stringify(body),
    });
    if (response.ok && (response.headers.get("content-type") || "").startsWith("text/event-stream")) {
      await streamAnswers(response, body, started);
      return;
    }
    const text = await response.text();
    const latency = performance.now() - started;
    $("#response-json").textContent = prettyJson(text);
    let payload = null;
    try {
      payload = JSON.parse(text);
    } catch {
      // Not JSON (a proxy's error page): shown raw below.
    }
    showStatus(response, latency, payload);
    if (response.ok) showAnswers(payload, body);
    else showApiError(response.status, payload, text);
  } catch (error) {
    showError("Could not reach the server", [{ text: String(error) }]);
  } finally {
    button.disabled = false;
    $("#result").classList.remove("busy");
  }
}

// Each answer is drawn the moment its stage is read; the Response JSON pane gets the assembled payload at the end.
async function streamAnswers(response, body, started) {
  $("#error").hidden = true;
  $("#answers").replaceChildren();
  $("#result").classList.remove("busy");
  showStatus(response, performance.now() - started, null, "streaming…");
  try {
    const payload = await readAnswerStream(response, (key, answer, stage) =>
      $("#answers").append(answerCard(key, answer, body.questions[key], stage)),
    );
    $("#response-json").textContent = JSON.stringify(payload, null, 2);
    showStatus(response, performance.now() - started, payload, "streamed");
    $("#answers").append(...skippedCards(payload.skipped));
  } catch (error) {
    if (!error.body) throw error;
    $("#response-json").textContent = JSON.stringify(error.body, null, 2);
    showStatus(response, performance.now() - started, null, "stream ended with an error");
    showApiError(response.status, error.body, "", { keepAnswers: true });
  }
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

function showStatus(response, latency, payload, stream = null) {
  const parts = [
    el("span", { class: response.ok ? "ok" : "bad" }, `HTTP ${response.status}`),
    stream ? el("span", { dataset: { field: "stream" } }, stream) : null,
    el("span", { dataset: { field: "latency" } }, `${Math.round(latency)} ms`),
  ].filter(Boolean);
  if (response.ok && payload) {
    parts.push(el("span", { dataset: { field: "model" } }, payload.model));
    parts.push(el("span", {}, `${payload.usage.input_tokens} tokens in · ${payload.usage.output_tokens} out`));
  }
  const requestId = response.headers.get("x-typesafe-request-id");
  if (requestId) parts.push(el("span", { class: "muted", title: "x-typesafe-request-id" }, `id ${requestId}`));
  $("#status").replaceChildren(...parts);
}

// ---- answers ---------------------------------------------------------------------------

function argmax(values) {
  return values.reduce((best, value, index) => (value > values[best] ? index : best), 0);
}

// Answers are drawn from their fields, whatever their kind: option probabilities as bars, a bare probability
// (a noul's P(true)) as its two sides, pieces of the state by their confidence, a box's edges by their position.
function answerRows(answer, question) {
  const value = answer[answer.type];
  if (answer.probabilities) {
    const names = Object.keys(answer.probabilities);
    const values = Object.values(answer.probabilities);
    const top = typeof value === "string" ? names.indexOf(value) : argmax(values);
    return names.map((name, index) => ({
      name,
      label: answer.legend ? `${name} · ${asText(answer.legend[name])}` : name,
      hint: answer.legend ? "" : asText(question?.criteria?.[name]),
      p: values[index],
      chosen: index === top,
    }));
  }
  if (typeof value === "number") {
    const sides = question?.criteria || {};
    return [
      { name: "true", label: "true", hint: asText(sides.true), p: value, chosen: value >= 0.5 },
      { name: "false", label: "false", hint: asText(sides.false), p: 1 - value, chosen: value < 0.5 },
    ];
  }
  const pieces = Array.isArray(value) ? value : answer.found ? [answer] : [];
  if (pieces.length || "found" in answer) {
    return pieces.map((piece) => ({ name: piece.text, label: `${piece.text} (${piece.start}–${piece.end})`, hint: "", p: piece.confidence, chosen: false }));
  }
  return Object.entries(value || {}).map(([edge, at]) => ({ name: edge, label: edge, hint: "position in the image", p: at, chosen: false }));
}

function bar(row) {
  return el(
    "div",
    { class: row.chosen ? "bar-row chosen" : "bar-row", dataset: { option: row.name, probability: String(row.p) } },
    el("span", { class: "bar-label", title: row.hint || row.label }, row.label),
    el("div", { class: "bar-track" }, el("div", { class: "bar-fill", style: { width: `${Math.max(0, Math.min(1, row.p)) * 100}%` } })),
    el("span", { class: "bar-value", title: String(row.p) }, fixed(row.p)),
  );
}

function headline(answer) {
  const value = answer[answer.type];
  if (typeof value === "string") return value;
  if (typeof value === "number" && answer.probabilities) return `${answer.type} ${fixed(value, 2)} of ${Object.keys(answer.probabilities).length - 1}`;
  if (typeof value === "number") return value >= 0.5 ? "yes" : "no";
  if (Array.isArray(value)) return `${value.length} found${answer.complete === false ? " (more not read)" : ""}`;
  if ("found" in answer) return answer.found ? answer.text : "not found";
  return Object.entries(value || {}).map(([edge, at]) => `${edge} ${fixed(at, 2)}`).join(" · ");
}

function facts(answer) {
  const items = [];
  if (typeof answer.confidence === "number") items.push(el("span", {}, "confidence ", el("b", { dataset: { field: "confidence" } }, fixed(answer.confidence))));
  else if (typeof answer[answer.type] === "number") items.push(el("span", {}, "P(true) ", el("b", { dataset: { field: answer.type } }, fixed(answer[answer.type]))));
  if (answer.abstain) items.push(el("span", { class: "badge warn" }, "abstains"));
  return el("div", { class: "facts" }, items);
}

function diagnostics(answer) {
  if (!("diagnostics" in answer)) return null;
  const entries = Object.entries(answer.diagnostics || {});
  const body = entries.length
    ? el("dl", {}, entries.map(([key, value]) => [el("dt", {}, key), el("dd", { dataset: { diagnostic: key } }, typeof value === "number" ? String(value) : JSON.stringify(value))]))
    : el("p", { class: "muted" }, "This model reports no diagnostics.");
  return el("details", { class: "diagnostics", open: true }, el("summary", {}, "diagnostics"), body);
}

function answerCard(key, answer, question, stage) {
  return el(
    "article",
    { class: "answer", dataset: { answer: key, type: answer.type } },
    el(
      "header",
      {},
      el("h3", {}, key),
      el("span", { class: `badge ${answer.type}` }, answer.type),
      stage ? el("span", { class: "badge", dataset: { field: "stage" } }, `stage ${stage}`) : null,
      el("span", { class: "headline" }, headline(answer)),
    ),
    facts(answer),
    el("div", { class: "bars" }, answerRows(answer, question).map(bar)),
    diagnostics(answer),
  );
}

// Questions whose ask_if was not met are not read; the response lists them with the reason.
function skippedCards(skipped) {
  return Object.entries(skipped || {}).map(([key, why]) =>
    el(
      "article",
      { class: "answer skipped", dataset: { answer: key, skipped: why.reason } },
      el("header", {}, el("h3", {}, key), el("span", { class: "badge" }, "skipped"), el("span", { class: "headline muted" }, why.reason)),
      el("p", { class: "muted" }, why.message || ""),
    ),
  );
}

function showAnswers(payload, body) {
  $("#error").hidden = true;
  $$(".question.invalid").forEach((card) => card.classList.remove("invalid"));
  const cards = Object.entries(payload.answers).map(([key, answer]) => answerCard(key, answer, body.questions[key], answer.diagnostics?.stage));
  $("#answers").replaceChildren(...cards, ...skippedCards(payload.skipped));
}

const START_MESSAGE = "Pick an example or write your own, then send.";

// Answers, errors and JSON of an earlier request must not sit beside a request they do not belong to.
function clearResult(message) {
  $("#status").replaceChildren(message);
  $("#error").hidden = true;
  $("#error").replaceChildren();
  $("#answers").replaceChildren();
  $("#request-json").textContent = "";
  $("#response-json").textContent = "";
  $$(".question.invalid").forEach((card) => card.classList.remove("invalid"));
}

// ---- errors ----------------------------------------------------------------------------

function showError(title, items, { keepAnswers = false } = {}) {
  if (!keepAnswers) $("#answers").replaceChildren();
  const list = el(
    "ul",
    {},
    items.map((item) =>
      el("li", {}, item.loc ? el("code", { class: "loc", dataset: { loc: JSON.stringify(item.loc) } }, item.loc.join(" → ")) : null, " ", el("span", { class: "msg" }, item.text)),
    ),
  );
  $("#error").replaceChildren(el("strong", {}, title), list);
  $("#error").hidden = false;
}

function showApiError(status, payload, text, options = {}) {
  $$(".question.invalid").forEach((card) => card.classList.remove("invalid"));
  const detail = payload?.detail;
  if (Array.isArray(detail)) {
    showError(`HTTP ${status}: the request is invalid`, detail.map((entry) => ({ loc: entry.loc, text: entry.msg })), options);
    for (const entry of detail) {
      if (entry.loc?.[1] !== "questions") continue;
      const card = $$(".question").find((c) => $(".question-id", c).value.trim() === String(entry.loc[2]));
      card?.classList.add("invalid");
    }
  } else if (detail && typeof detail === "object") {
    showError(`HTTP ${status}: ${detail.error_type || "error"}`, [{ text: detail.message || JSON.stringify(detail) }], options);
  } else {
    showError(`HTTP ${status}`, [{ text: typeof detail === "string" ? detail : text || "(empty response)" }], options);
  }
}

// ---- start -----------------------------------------------------------------------------

async function loadModels() {
  const select = $("#model");
  const previous = select.value;
  try {
    const response = await fetch("v1/models", { headers: headers() });
    if (!response.ok) throw new Error(`GET /v1/models answered HTTP ${response.status}`);
    const { models } = await response.json();
    select.replaceChildren(...models.map((m) => el("option", { value: m.name, title: m.description }, m.name)));
    if (models.some((m) => m.name === previous)) select.value = previous;
  } catch (error) {
    select.replaceChildren(el("option", { value: "jev-latest" }, "jev-latest"));
    showError("Could not list the models", [{ text: error.message }]);
  }
}

// With --api-key on, /metrics answers 401 to a plain link: fetch it with the key and show its text instead.
async function openMetrics(event) {
  const auth = headers();
  if (!auth.Authorization) return; // no key given: the link itself works (keys are off) or shows the 401
  event.preventDefault();
  const response = await fetch("metrics", { headers: auth });
  location.href = URL.createObjectURL(new Blob([await response.text()], { type: "text/plain" }));
}

const kindsRefused = (error) => showError("Could not read the question kinds", [{ text: error.message }]);

function start() {
  const apiKey = $("#api-key");
  apiKey.value = localStorage.getItem("canvasread.apiKey") || "";
  apiKey.addEventListener("change", () => {
    localStorage.setItem("canvasread.apiKey", apiKey.value.trim());
    const unknown = !Object.keys(KINDS).length; // the schema was refused without a key: the cards wait for it
    loadKinds().then(() => unknown && loadExample(EXAMPLES[Number($("#example").value)]), kindsRefused);
    loadModels();
  });
  const examples = $("#example");
  examples.replaceChildren(...EXAMPLES.map((example, index) => el("option", { value: String(index) }, example.name)));
  examples.addEventListener("change", () => loadExample(EXAMPLES[Number(examples.value)]));
  $("#send").addEventListener("click", send);
  $('nav a[href="metrics"]').addEventListener("click", openMetrics);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) send();
  });
  const kinds = loadKinds().catch(kindsRefused);
  kinds.then(() => loadExample(EXAMPLES[0]));
  Promise.all([kinds, loadModels()]).then(() => document.body.classList.add("ready"));
}

start();
