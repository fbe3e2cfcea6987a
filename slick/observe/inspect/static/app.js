// slick inspect: plain JS, inline SVG charts, no network access beyond this server's /api.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const DEFAULT_KEYS = ["rollout/raw_reward", "rollout/response_len/mean", "train/loss", "train/pg_loss",
  "train/ppo_kl", "rollout/staleness/mean", "perf/step_time", "perf/tokens_per_sec"];
const COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c"];
const state = { updated: null, metrics: null, steps: null, step: null, sample: null, extraKeys: [], colour: "mask" };

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = String(text);
  return e;
}
function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return Number.isInteger(v) ? String(v) : v.toFixed(a < 1 ? 4 : 2);
}
async function api(path) {
  const r = await fetch(path, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
  return body;
}

// ---------------------------------------------------------------- charts
const W = 320, H = 150, PAD = { l: 44, r: 8, t: 8, b: 20 };

function frame(title) {
  const box = el("div", { class: "chart" });
  box.appendChild(el("div", { class: "title" }, title));
  const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  box.appendChild(svg);
  return [box, svg];
}
function scale(d0, d1, r0, r1) {
  if (d1 === d0) { d0 -= 0.5; d1 += 0.5; }
  return (v) => r0 + (v - d0) / (d1 - d0) * (r1 - r0);
}
function axes(svg, x0, x1, y0, y1) {
  svg.appendChild(svgEl("line", { x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b, stroke: "#9ca3af" }));
  svg.appendChild(svgEl("line", { x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b, stroke: "#9ca3af" }));
  svg.appendChild(svgEl("text", { x: PAD.l - 4, y: PAD.t + 8, "text-anchor": "end" }, fmt(y1)));
  svg.appendChild(svgEl("text", { x: PAD.l - 4, y: H - PAD.b, "text-anchor": "end" }, fmt(y0)));
  svg.appendChild(svgEl("text", { x: PAD.l, y: H - 6 }, fmt(x0)));
  svg.appendChild(svgEl("text", { x: W - PAD.r, y: H - 6, "text-anchor": "end" }, fmt(x1)));
}
function extent(values) {
  const v = values.filter((x) => x !== null && x !== undefined && Number.isFinite(x));
  if (!v.length) return [0, 1];
  const lo = Math.min(...v), hi = Math.max(...v);
  if (lo < hi) return [lo, hi];
  const pad = Math.max(Math.abs(lo) * 0.1, 0.5);         // a flat series sits mid-chart with a readable axis
  return [lo - pad, hi + pad];
}

// series: [{name, xs, ys}] drawn as polylines (gaps at missing values) with dots
function lineChart(title, series) {
  const [box, svg] = frame(title);
  const [x0, x1] = extent(series.flatMap((s) => s.xs));
  const [y0, y1] = extent(series.flatMap((s) => s.ys));
  const sx = scale(x0, x1, PAD.l, W - PAD.r), sy = scale(y0, y1, H - PAD.b, PAD.t);
  axes(svg, x0, x1, y0, y1);
  series.forEach((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    let pts = [];
    const flush = () => {
      if (pts.length > 1) svg.appendChild(svgEl("polyline", { points: pts.join(" "), fill: "none", stroke: colour,
        "stroke-width": 1.5 }));
      pts = [];
    };
    s.xs.forEach((x, j) => {
      const y = s.ys[j];
      if (y === null || y === undefined || !Number.isFinite(y)) { flush(); return; }
      pts.push(`${sx(x).toFixed(1)},${sy(y).toFixed(1)}`);
      const dot = svgEl("circle", { cx: sx(x), cy: sy(y), r: 2, fill: colour });
      dot.appendChild(svgEl("title", {}, `${s.name} @ ${x}: ${fmt(y)}`));
      svg.appendChild(dot);
    });
    flush();
    if (series.length > 1) svg.appendChild(svgEl("text", { x: PAD.l + 6 + 90 * i, y: PAD.t + 8, fill: colour,
      style: `fill:${colour}` }, s.name));
  });
  return box;
}
// per step: min-max whisker, quartile box, mean dot
function bandChart(title, steps) {
  const [box, svg] = frame(title);
  const xs = steps.map((s) => s.step);
  const [x0, x1] = extent(xs);
  const [y0, y1] = extent(steps.flatMap((s) => [s.reward_min, s.reward_max]));
  const sx = scale(x0, x1, PAD.l + 8, W - PAD.r - 8), sy = scale(y0, y1, H - PAD.b, PAD.t);
  axes(svg, x0, x1, y0, y1);
  const half = Math.max(2, Math.min(10, (W - PAD.l - PAD.r) / Math.max(steps.length, 1) / 3));
  for (const s of steps) {
    if (s.reward_min === null) continue;
    const x = sx(s.step);
    svg.appendChild(svgEl("line", { x1: x, x2: x, y1: sy(s.reward_min), y2: sy(s.reward_max), stroke: "#6b7280" }));
    const [q1, , q3] = s.reward_q;
    svg.appendChild(svgEl("rect", { x: x - half, width: 2 * half, y: sy(q3), height: Math.max(1, sy(q1) - sy(q3)),
      fill: "#bfdbfe", stroke: "#2563eb" }));
    const dot = svgEl("circle", { cx: x, cy: sy(s.reward_mean), r: 2.5, fill: "#dc2626" });
    dot.appendChild(svgEl("title", {}, `step ${s.step}: mean ${fmt(s.reward_mean)}, min ${fmt(s.reward_min)}, ` +
      `max ${fmt(s.reward_max)}, n ${s.n}`));
    svg.appendChild(dot);
  }
  return box;
}
function histChart(title, counts, lo, hi, colour) {
  const [box, svg] = frame(title);
  const top = Math.max(1, ...counts);
  axes(svg, lo, hi, 0, top);
  const bw = (W - PAD.l - PAD.r) / counts.length;
  counts.forEach((c, i) => {
    const h = (H - PAD.b - PAD.t) * c / top;
    const bar = svgEl("rect", { x: PAD.l + i * bw + 1, width: Math.max(1, bw - 2), y: H - PAD.b - h, height: h,
      fill: colour });
    const a = lo + (hi - lo) * i / counts.length, b = lo + (hi - lo) * (i + 1) / counts.length;
    bar.appendChild(svgEl("title", {}, `[${fmt(a)}, ${fmt(b)}): ${c}`));
    svg.appendChild(bar);
  });
  return box;
}

// ---------------------------------------------------------------- sections
function renderCurves() {
  const m = state.metrics, box = document.getElementById("curves");
  box.replaceChildren();
  document.getElementById("curves-message").textContent = m.message || (m.rows.length ? "" : "no metrics yet");
  const select = document.getElementById("add-key");
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "" }, "choose a metric…"));
  for (const k of m.keys) select.appendChild(el("option", { value: k }, k));
  select.value = chosen;
  const keys = DEFAULT_KEYS.filter((k) => m.keys.includes(k)).concat(state.extraKeys.filter((k) => !DEFAULT_KEYS.includes(k)));
  for (const k of keys) {
    const rows = m.rows.filter((r) => r[k] !== undefined);
    box.appendChild(lineChart(k, [{ name: k, xs: rows.map((r) => r.step), ys: rows.map((r) => r[k]) }]));
  }
}
function renderSteps() {
  const s = state.steps, box = document.getElementById("dists");
  box.replaceChildren();
  document.getElementById("store-message").textContent = s.message || "";
  if (!s.steps.length) return;
  box.appendChild(bandChart("reward per step (box: quartiles, dot: mean, line: min-max)", s.steps));
  box.appendChild(lineChart("response length per step (mean, max)", [
    { name: "mean", xs: s.steps.map((x) => x.step), ys: s.steps.map((x) => x.len_mean) },
    { name: "max", xs: s.steps.map((x) => x.step), ys: s.steps.map((x) => x.len_max) }]));
  box.appendChild(lineChart("staleness per step (trainer version - oldest token's version)", [
    { name: "mean", xs: s.steps.map((x) => x.step), ys: s.steps.map((x) => x.staleness_mean) },
    { name: "max", xs: s.steps.map((x) => x.step), ys: s.steps.map((x) => x.staleness_max) }]));
  const cur = s.steps.find((x) => x.step === state.step) || s.steps[s.steps.length - 1];
  box.appendChild(histChart(`reward histogram, step ${cur.step} (n ${cur.n})`, cur.reward_hist, s.reward_range[0],
    s.reward_range[1], "#60a5fa"));
  box.appendChild(histChart(`response length histogram, step ${cur.step}`, cur.len_hist, s.len_range[0],
    s.len_range[1], "#34d399"));
  const select = document.getElementById("step-select");
  select.replaceChildren();
  for (const x of s.steps) select.appendChild(el("option", { value: x.step }, x.step));
  select.value = String(cur.step);
}
function verdictPill(r) {
  if (r.reward_error) return el("span", { class: "pill error" }, "reward error");
  if (r.verdict === null || r.verdict === undefined) return el("span", { class: "pill" }, "no verdict");
  const pass = r.verdict === "True" || r.verdict === "true";
  return el("span", { class: "pill " + (pass ? "pass" : "fail") }, "verdict " + r.verdict);
}
function card(r) {
  const c = el("div", { class: "card", "data-index": r.index });
  if (state.sample && state.sample.index === r.index && state.sample.step === r.step) c.classList.add("selected");
  const head = el("div", { class: "head" }, `#${r.index} group ${r.group_index} · reward ${fmt(r.reward)} · ` +
    `${r.response_length} tokens · ${r.status} · staleness ${fmt(r.staleness)} `);
  head.appendChild(verdictPill(r));
  c.appendChild(head);
  c.appendChild(el("pre", { class: "prompt" }, String(r.prompt).slice(0, 300)));
  c.appendChild(el("pre", {}, String(r.response).slice(0, 600)));
  if (r.evidence) c.appendChild(el("pre", { class: "evidence muted" }, JSON.stringify(r.evidence)));
  c.addEventListener("click", () => loadSample(r.step, r.index));
  return c;
}
async function renderSamples() {
  if (state.step === null) return;
  for (const order of ["best", "worst"]) {
    const res = await api(`/api/samples?step=${state.step}&order=${order}&limit=5`);
    const box = document.getElementById(order);
    box.replaceChildren(...res.samples.map(card));
  }
}
function tokenColour(t) {
  if (state.colour === "mask") return null;
  if (t.logprob === null || t.logprob === undefined) return "#e5e7eb";
  const p = Math.exp(t.logprob);                       // red = unlikely under the sampling policy
  return `rgba(239, 68, 68, ${(1 - p).toFixed(3)})`;
}
function renderLegend() {
  const lg = document.getElementById("legend");
  lg.replaceChildren();
  if (state.colour === "mask") {
    lg.appendChild(el("span", { class: "tok train" }, "trained token (mask 1)"));
    lg.appendChild(el("span", { class: "tok tool" }, "tool / environment token (mask 0)"));
  } else {
    lg.appendChild(el("span", { style: "background: rgba(239,68,68,0.9)" }, "p ≈ 0.1"));
    lg.appendChild(el("span", { style: "background: rgba(239,68,68,0.5)" }, "p ≈ 0.5"));
    lg.appendChild(el("span", { style: "background: rgba(239,68,68,0.02)" }, "p ≈ 1"));
  }
}
function renderSample() {
  renderLegend();
  const s = state.sample;
  if (!s) return;
  document.getElementById("sample-title").textContent = `#${s.index} of step ${s.step}`;
  const kv = document.getElementById("sample-kv");
  kv.replaceChildren();
  const fields = [["prompt", s.prompt], ["label", JSON.stringify(s.label)], ["reward", fmt(s.reward)],
    ["raw reward", JSON.stringify(s.reward_raw)], ["status", s.status], ["train version", s.train_version],
    ["staleness", s.staleness], ["reward error", s.reward_error]];
  for (const [k, v] of fields) {
    if (v === null || v === undefined) continue;
    const tr = el("tr");
    tr.appendChild(el("td", {}, k));
    tr.appendChild(el("td", {}, v));
    kv.appendChild(tr);
  }
  const box = document.getElementById("tokens");
  box.replaceChildren();
  for (const t of s.tokens) {
    const span = el("span", { class: "tok " + (t.mask === 0 ? "tool" : "train"), "data-mask": t.mask },
      t.text === null ? `⟨${t.id}⟩` : t.text);
    const colour = tokenColour(t);
    if (colour) { span.className = "tok"; span.style.background = colour; }
    span.title = `#${t.pos} id ${t.id} · mask ${t.mask} · logprob ${fmt(t.logprob)} · version ${t.version}`;
    box.appendChild(span);
  }
  document.getElementById("sample-evidence").textContent = s.evidence ? JSON.stringify(s.evidence, null, 2) : "(none)";
  for (const c of document.querySelectorAll(".card")) {
    c.classList.toggle("selected", Number(c.dataset.index) === s.index && state.step === s.step);
  }
}
async function loadSample(step, index) {
  state.sample = await api(`/api/sample?step=${step}&index=${index}`);
  renderSample();
}

// ---------------------------------------------------------------- refresh
async function refresh(force) {
  const info = await api("/api/run");
  document.getElementById("run-name").textContent = info.name;
  document.getElementById("run-meta").textContent = [info.model && `model ${info.model}`,
    info.verifier && `verifier ${info.verifier}`, info.advantage_estimator && `estimator ${info.advantage_estimator}`,
    `${info.stored_steps.length} stored steps`].filter(Boolean).join(" · ");
  const meta = document.getElementById("run-meta");
  if (info.trace) {   // --trace-file: the run's timeline, for ui.perfetto.dev or chrome://tracing
    const a = document.createElement("a");
    a.href = "/trace.json";
    a.download = info.trace;
    a.textContent = "timeline trace (open in ui.perfetto.dev)";
    meta.append(" · ", a);
  }
  document.getElementById("updated").textContent = info.updated ?
    "updated " + new Date(info.updated * 1000).toLocaleTimeString() : "";
  if (!force && info.updated === state.updated) return;
  state.updated = info.updated;
  [state.metrics, state.steps] = await Promise.all([api("/api/metrics"), api("/api/steps")]);
  const steps = state.steps.steps.map((s) => s.step);
  if (state.step === null || !steps.includes(state.step) || state.followLatest) {
    state.step = steps.length ? steps[steps.length - 1] : null;
    state.followLatest = true;
  }
  renderCurves();
  renderSteps();
  await renderSamples();
  renderSample();
}
function report(e) {
  document.getElementById("store-message").textContent = "error: " + e.message;
}

document.getElementById("step-select").addEventListener("change", (ev) => {
  state.step = Number(ev.target.value);
  const steps = state.steps.steps.map((s) => s.step);
  state.followLatest = state.step === steps[steps.length - 1];
  renderSteps();
  renderSamples().catch(report);
});
document.getElementById("add-key").addEventListener("change", (ev) => {
  if (ev.target.value && !state.extraKeys.includes(ev.target.value)) state.extraKeys.push(ev.target.value);
  renderCurves();
});
for (const r of document.querySelectorAll("input[name=colour]")) {
  r.addEventListener("change", (ev) => { state.colour = ev.target.value; renderSample(); });
}
setInterval(() => { if (document.getElementById("auto").checked) refresh(false).catch(report); }, 5000);
refresh(true).then(() => { document.body.dataset.ready = "1"; }).catch(report);
