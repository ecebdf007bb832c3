// Rollout inspector (/runs/<id>/samples): one sampled step's groups side by side, each
// rollout's tokens coloured by |behaviour - learner| logprob gap; a multi-turn
// trajectory turn by turn (model turns shaded, observations set apart).
//
//   first draw: the page's json_script (the latest sampled step, no filter)
//   slider / filters change -> GET api_url?step=K&filters -> draw
//   ws/runs/<id>/ says a "samples" event was stored -> its step joins the slider; while
//   "follow the latest step" is ticked the slider moves there and the step is drawn
//
// Model text reaches the DOM only through textContent and title: never as HTML.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("samples-data").textContent);
  const slider = document.getElementById("step-slider");
  const label = document.getElementById("step-label");
  const follow = document.getElementById("follow");
  const form = document.getElementById("inspector-filters");
  const groupsBox = document.getElementById("sample-groups");
  const summary = document.getElementById("inspector-summary");
  const GAP_FULL = 1.0;  // a gap of this many nats is drawn fully red
  let steps = data.steps.slice();
  let lastSeq = data.last_seq;
  let pending = null;    // the fetch in flight: a newer one supersedes it

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function fmt(x, digits) {
    return x === null || x === undefined ? "–" : Number(x).toFixed(digits);
  }
  // A logprob gap: fp32 round-off (1e-6) must not read 0.000, nor a real zero 0.0e+0.
  function fmtGap(x) {
    if (x === null || x === undefined) return "–";
    const v = Number(x);
    return v === 0 || Math.abs(v) >= 1e-3 ? fmt(v, 3) : v.toExponential(1);
  }

  function tokenSpan(text, b, l) {
    const gap = b === null || l === null ? null : Math.abs(b - l);
    const span = el("span", "tok", text);
    const alpha = gap === null ? 0 : Math.min(gap / GAP_FULL, 1);
    span.style.backgroundColor = "rgba(220, 38, 38, " + alpha.toFixed(3) + ")";
    span.title = "behaviour " + fmt(b, 4) + " · learner " + fmt(l, 4) + " · gap " + fmtGap(gap);
    if (gap !== null) span.dataset.gap = String(gap);
    return span;
  }

  function sampleCard(s) {
    const card = el("article", "sample" + (s.match ? " sample-match" : " sample-other"));
    card.dataset.index = s.index;
    const facts = el("div", "sample-facts");
    const pairs = [
      ["reward", fmt(s.reward, 3)], ["reason", s.reason], ["advantage", fmt(s.advantage, 3)],
      ["version", s.mixes_versions ? s.version + "→" + s.last_version : s.version],
      ["staleness", s.staleness], ["length", s.length + (s.truncated ? " (truncated)" : "")],
      ["max gap", fmtGap(s.max_gap)]];
    for (const [k, v] of pairs) {
      const item = el("span", "fact");
      item.append(el("b", null, k + " "), el("span", null, v));
      facts.append(item);
    }
    card.append(facts);
    card.append(el("pre", "completion", s.completion));
    const t = s.tokens;
    if (t.turns && t.turns.length) {
      card.append(trajectory(t));
      return card;
    }
    const tokens = el("div", "tokens");
    for (let i = 0; i < t.text.length; i++) {
      tokens.append(tokenSpan(t.text[i], t.behaviour[i], t.learner[i]));
    }
    card.append(tokens);
    return card;
  }

  // A multi-turn trajectory turn by turn: model turns (version, step reward, tokens shaded
  // by the gap) and the environment's observations (not sampled: no logprob, no shade).
  function trajectory(t) {
    const box = el("div", "trajectory");
    let k = 0;
    for (const turn of t.turns) {
      const model = turn.role === "model";
      const part = el("div", "turn " + (model ? "turn-model" : "turn-env"));
      part.dataset.role = turn.role;
      const head = el("div", "turn-head");
      if (model) {
        k += 1;
        head.textContent = "turn " + k + " · version " + turn.version +
          " · reward " + (turn.reward === null ? "–" : fmt(turn.reward, 3));
        part.dataset.version = turn.version;
      } else {
        head.textContent = "observation";
      }
      const tokens = el("div", "tokens");
      for (let i = turn.start; i < turn.end; i++) {
        if (model) {
          tokens.append(tokenSpan(t.text[i], t.behaviour[i], t.learner[i]));
        } else {
          const span = el("span", "tok tok-obs", t.text[i]);
          span.title = "observation: not sampled, no logprob";
          tokens.append(span);
        }
      }
      part.append(head, tokens);
      box.append(part);
    }
    return box;
  }

  function draw(view) {
    groupsBox.replaceChildren();
    if (view.step === null) {
      groupsBox.append(el("p", "empty", "No samples yet: the engine sends " +
        "telemetry.sample_groups groups after each step."));
      summary.textContent = "";
      return;
    }
    summary.textContent = "Step " + view.step + ": " + view.matching + " of " + view.samples +
      " rollouts match, in " + view.groups.length + " group(s).";
    for (const g of view.groups) {
      const box = el("section", "sample-group");
      box.dataset.group = g.group;
      const head = el("div", "group-head");
      head.append(el("b", null, "group " + g.group), el("span", "group-gap",
        "largest gap " + fmtGap(g.max_gap)));
      box.append(head, el("pre", "prompt", g.prompt));
      const row = el("div", "group-samples");
      for (const s of g.samples) row.append(sampleCard(s));
      box.append(row);
      groupsBox.append(box);
    }
  }

  function selectedStep() {
    return steps.length ? steps[Number(slider.value)] : null;
  }

  function query() {
    const params = new URLSearchParams();
    const step = selectedStep();
    if (step !== null) params.set("step", step);
    for (const [k, v] of new FormData(form)) if (v !== "") params.set(k, v);
    return params;
  }

  async function load() {
    const step = selectedStep();
    label.textContent = step === null ? "none yet" : step;
    const ticket = {};
    pending = ticket;
    const response = await fetch(data.api_url + "?" + query(), {credentials: "same-origin"});
    const body = await response.json();
    if (pending !== ticket) return;  // a later request owns the page
    if (!response.ok) {
      const errors = body.errors || [{field: "request", message: body.detail}];
      summary.textContent = errors.map((e) => e.field + ": " + e.message).join("; ");
      return;
    }
    draw(body);
  }

  function addStep(step) {
    if (steps.includes(step)) { if (step === selectedStep()) load(); return; }
    steps.push(step);
    steps.sort((a, b) => a - b);
    slider.max = String(steps.length - 1);
    if (follow.checked) {
      slider.value = String(steps.length - 1);
      load();
    }
  }

  slider.addEventListener("input", () => {
    follow.checked = Number(slider.value) === steps.length - 1;
    load();
  });
  form.addEventListener("change", (e) => { if (e.target !== follow && e.target !== slider) load(); });
  form.addEventListener("submit", (e) => { e.preventDefault(); load(); });

  draw(data);
  if (data.live) {
    window.rlplaneLiveSocket(data.ws_path, {
      onOpen: (ws) => ws.send(JSON.stringify({last_seq: lastSeq})),
      onMessage: (msg) => {
        if (!msg.events) return;   // alerts and errors are the run page's business
        lastSeq = Math.max(lastSeq, msg.last_seq);
        for (const e of msg.events) if (e.type === "samples") addStep(e.step);
      },
    });
  }
})();
