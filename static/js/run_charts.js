// Run page: draw every chart once from the page's json_script, then extend the traces in
// place from ws/runs/<id>/ (Plotly.extendTraces; a chart's container is never replaced).
// On reconnect the socket resumes after the last seq applied, so nothing repeats or is lost.
// Each live control applied (checkpoint, pause, lr, eval cadence) is a dotted vertical line
// at the step it took effect from, on every metric chart (Plotly.relayout of the shapes).
// The x axis switch redraws the metric charts against wall time (seconds since the first
// reported step, by the engine's clock) and back; each chart's step x arrays are kept here.
// The header lives: step (steps trained) and the ETA's inputs come with each message
// (jobs/queries/run_page.py progress_clock), elapsed and ETA tick each second from them on
// the server's clock; the action buttons follow the badge (Archive/Delete when it ends).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("run-data").textContent);
  const plotConfig = {responsive: true, displaylogo: false};
  const maxPoints = {};  // per chart; undefined keeps every point
  const MAX_LOG_LINES = 500;
  const TERMINAL = data.terminal_statuses;  // jobs/models/status.py, via the page
  const NAMES = data.metric_names;  // engine/metrics.py, via the page (jobs/queries/run_page.py)
  let lastSeq = data.last_seq;

  const stepXs = {};  // metric chart id -> per trace, the steps of its points
  const stepTime = data.step_times;  // step -> unix seconds its metrics were reported
  let axis = "step";
  function startTime() { return Math.min(...Object.values(stepTime)); }
  function toX(steps) {
    if (axis === "step") return steps;
    const t0 = startTime();
    return steps.map((s) => (stepTime[s] === undefined ? null : stepTime[s] - t0));
  }
  for (const fig of data.charts) {
    maxPoints[fig.id] = fig.max_points;
    if (fig.id !== "timeline") stepXs[fig.id] = fig.traces.map((t) => t.x.slice());
    Plotly.newPlot("chart-" + fig.id, fig.traces, fig.layout, plotConfig);
  }

  const marks = [];  // jobs/charts.py control_marks, replacement_marks: {step, label[, color]}
  function drawMarks() {
    const xs = toX(marks.map((m) => m.step));
    const shapes = marks.map((m, i) => ({
      type: "line", xref: "x", yref: "paper", x0: xs[i], x1: xs[i], y0: 0, y1: 1,
      line: {color: m.color || "#4b2e9c", width: 1, dash: "dot"}}));
    const annotations = marks.map((m, i) => ({
      x: xs[i], xref: "x", y: 1, yref: "paper", text: m.label, showarrow: false,
      textangle: -90, xanchor: "right", yanchor: "top",
      font: {size: 10, color: m.color || "#4b2e9c"}}));
    for (const id of Object.keys(stepXs)) {  // the timeline has a time axis of its own
      Plotly.relayout("chart-" + id, {shapes: shapes, annotations: annotations});
    }
  }
  function addMarks(more) {
    if (!more || !more.length) return;
    marks.push(...more);
    drawMarks();
  }
  addMarks(data.marks);

  function setAxis(value) {
    axis = value;
    for (const [id, xs] of Object.entries(stepXs)) {
      Plotly.update("chart-" + id, {x: xs.map(toX)},
                    {"xaxis.title.text": axis === "wall" ? "wall time (s)" : "step"});
    }
    if (marks.length) drawMarks();
  }
  for (const radio of document.querySelectorAll('#axis-switch input[name="axis"]')) {
    radio.addEventListener("change", () => setAxis(radio.value));
  }

  function setText(id, text) {
    const el = document.getElementById(id);
    if (el) el.textContent = text;
  }
  // "4m 05s", as jobs/templatetags/run_format.py's duration filter writes it.
  function duration(seconds) {
    const total = Math.round(seconds);
    const h = Math.floor(total / 3600), m = Math.floor((total % 3600) / 60), s = total % 60;
    const pad = (n) => String(n).padStart(2, "0");
    if (h) return h + "h " + pad(m) + "m";
    if (m) return m + "m " + pad(s) + "s";
    return s + "s";
  }
  let clock = data.progress;  // {now, started_at, finished_at, eta_s, step, terminal}
  let skew = Date.now() / 1000 - clock.now;  // this browser's clock minus the server's
  function tick() {
    const now = Date.now() / 1000 - skew;
    if (clock.started_at !== null) {
      const end = clock.finished_at !== null ? clock.finished_at : now;
      setText("progress-elapsed", duration(Math.max(0, end - clock.started_at)));
    }
    const etaItem = document.getElementById("progress-eta-item");
    const live = clock.eta_s !== null && !clock.terminal;
    if (etaItem) etaItem.hidden = !live;
    const badge = document.getElementById("run-status");
    const held = badge && badge.textContent.trim() === "paused";  // no step comes: it waits
    const left = held ? clock.eta_s : clock.eta_s - (now - clock.now);
    if (live) setText("progress-eta", duration(Math.max(0, left)));
  }
  function setClock(progress) {
    clock = progress;
    skew = Date.now() / 1000 - clock.now;
    if (clock.step !== null) setText("progress-step", clock.step);
    tick();
  }
  tick();
  setInterval(tick, 1000);

  function show(id, visible) {
    const el = document.getElementById(id);
    if (el) el.hidden = !visible;
  }
  function removeAll(ids) {
    for (const id of ids) {
      const el = document.getElementById(id);
      if (el) el.remove();
    }
  }
  function fitActions(shown) {  // the buttons that fit the badge's status
    const ended = TERMINAL.includes(shown);
    if (ended) {  // a run that ended live has nothing left to stop or steer
      removeAll(["stop-form", "live-controls", "priority-form", "queue-reason"]);
    } else if (shown !== "queued") {  // admitted: no place in the queue to set or show
      removeAll(["priority-form", "queue-reason"]);
      const stop = document.querySelector("#stop-form button");
      if (stop) stop.textContent = "Stop";
    }
    show("archive-form", ended);
    show("delete-form", ended);
    // Live controls once the driver runs (it polls none while submitting, or stopping).
    show("live-controls", shown === "running" || shown === "paused");
    show("control-pause", shown !== "paused");
    show("control-resume", shown === "paused");
  }

  function followProgress(events) {  // the header's rewards, from metrics events
    for (const e of events) {
      if (e.type !== "metrics.append") continue;
      stepTime[e.step] = e.ts;
      const reward = e.values[NAMES.reward];
      if (typeof reward === "number") setText("progress-reward", reward.toFixed(3));
      const heldOut = e.values[NAMES.held_out];
      if (typeof heldOut === "number") {
        setText("progress-held-out", heldOut.toFixed(3) + " (step " + e.step + ")");
      }
    }
  }

  function apply(msg) {
    if (msg.error) { console.error("run socket:", msg.error); return; }
    if (msg.alerts) {  // run_alerts.js; the health strip comes with them
      window.rlplaneAlerts.upsert(msg.alerts);
      swap(msg.swap || {});
      return;
    }
    if (msg.logs) { appendLines(msg.logs); return; }  // a launched command's output
    if (msg.last_seq <= lastSeq) return;  // the server never resends; belt and braces
    followProgress(msg.events);
    for (const [id, u] of Object.entries(msg.charts)) {
      if (!(id in maxPoints)) continue;  // a chart this run's page does not draw
      if (stepXs[id]) u.indices.forEach((trace, k) => stepXs[id][trace].push(...u.x[k]));
      const update = {x: stepXs[id] ? u.x.map(toX) : u.x, y: u.y};
      if (u.base) update.base = u.base;
      Plotly.extendTraces("chart-" + id, update, u.indices, maxPoints[id]);
      const div = document.getElementById("chart-" + id);
      if (div.layout.xaxis && div.layout.xaxis.showticklabels === false) {  // drawn empty
        Plotly.relayout(div, {"xaxis.showticklabels": true, "xaxis.autorange": true});
      }
    }
    addMarks(msg.marks);
    swap(msg.swap);
    const badge = document.getElementById("run-status");
    if (badge) fitActions(badge.textContent.trim());
    if (msg.progress) setClock(msg.progress);
    appendLines(msg.append);
    lastSeq = msg.last_seq;
  }

  function swap(fragments) {  // {id: html}: each element replaced whole
    for (const [id, html] of Object.entries(fragments)) {
      const el = document.getElementById(id);
      if (el) el.outerHTML = html;
    }
  }

  function appendLines(fragments) {
    for (const [id, html] of Object.entries(fragments)) {
      const el = document.getElementById(id);
      if (!el) continue;
      el.insertAdjacentHTML("beforeend", html);
      while (el.children.length > MAX_LOG_LINES) el.firstElementChild.remove();
    }
  }

  window.rlplaneLiveSocket(data.ws_path, {  // live_socket.js
    onOpen: (ws) => ws.send(JSON.stringify({last_seq: lastSeq})),
    onMessage: apply,
  });
})();
