// Runs list: rows update in place from ws/runs/ (one summary per ingested batch). A run newer
// than the table shows makes htmx reload the table, unless the list is filtered or paged
// (it also reloads every 30 s).
(function () {
  "use strict";

  function setText(row, cls, text) {
    const cell = row.querySelector("." + cls);
    if (cell) cell.textContent = text;
  }

  function apply(msg) {
    const row = document.getElementById("run-" + msg.run_id);
    if (!row) {  // a filtered list would reload for every run it leaves out: it polls
      // A run on an older page (ids grow with creation) is no reason to reload either.
      const shown = Array.from(document.querySelectorAll("#runs tbody tr[id^='run-']"),
                               (r) => Number(r.id.slice(4)));
      const newer = !shown.length || msg.run_id > Math.max(...shown);
      if (!window.location.search && newer) htmx.trigger("#runs", "runs-changed");
      return;
    }
    for (const [id, html] of Object.entries(msg.swap)) {
      const el = document.getElementById(id);
      if (el) el.outerHTML = html;
    }
    if (msg.step !== null) setText(row, "step", msg.step);
    if (msg.reward_mean !== null) setText(row, "reward", msg.reward_mean.toFixed(3));
    if (msg.step_s !== null) setText(row, "step-s", msg.step_s.toFixed(2) + " s");
    if (msg.held_out !== null) setText(row, "held-out", msg.held_out.toFixed(3));
  }

  window.rlplaneLiveSocket("/ws/runs/", {onMessage: apply});  // live_socket.js
})();
