// The run form keeps one source of truth, the TOML textarea:
//   paste / type / load a config  -> each select[data-toml-table] shows that table's `type`
//   change a select               -> that table's `type = "..."` line is rewritten (or added)
//   click an error's "line N"     -> that line of the TOML is selected
// It reads only header lines ([table]) and `type = "..."` lines, as the server's TOML does.
(function () {
  "use strict";
  const HEADER = /^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$/;
  const TYPE = /^(\s*type\s*=\s*)(["'])([^"']*)\2(.*)$/;

  function tableName(line) {
    const m = HEADER.exec(line);
    return m ? m[1].replace(/["'\s]/g, "") : null;
  }

  // [start, end) line indexes of the table's body (after its header), or null.
  function tableBody(lines, table) {
    for (let i = 0; i < lines.length; i++) {
      if (tableName(lines[i]) !== table) continue;
      let end = i + 1;
      while (end < lines.length && tableName(lines[end]) === null) end++;
      return [i + 1, end];
    }
    return null;
  }

  function typeIn(text, table) {
    const lines = text.split("\n");
    const body = tableBody(lines, table);
    if (!body) return null;
    for (let i = body[0]; i < body[1]; i++) {
      const m = TYPE.exec(lines[i]);
      if (m) return m[3];
    }
    return null;
  }

  function withType(text, table, value) {
    const lines = text.split("\n");
    const body = tableBody(lines, table);
    if (!body) {
      const sep = text === "" || text.endsWith("\n") ? "" : "\n";
      return `${text}${sep}\n[${table}]\ntype = "${value}"\n`;
    }
    for (let i = body[0]; i < body[1]; i++) {
      const m = TYPE.exec(lines[i]);
      if (m) {
        lines[i] = `${m[1]}"${value}"${m[4]}`;
        return lines.join("\n");
      }
    }
    lines.splice(body[0], 0, `type = "${value}"`);
    return lines.join("\n");
  }

  function showTypes(form) {
    const text = form.querySelector("textarea[name=config]").value;
    form.querySelectorAll("select[data-toml-table]").forEach((select) => {
      const chosen = typeIn(text, select.dataset.tomlTable);
      if (chosen !== null && [...select.options].some((o) => o.value === chosen)) {
        select.value = chosen;
      }
    });
  }

  function selectLine(textarea, line) {
    const lines = textarea.value.split("\n");
    const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
    textarea.focus();
    textarea.setSelectionRange(start, start + (lines[line - 1] || "").length);
    const lineHeight = textarea.scrollHeight / Math.max(lines.length, 1);
    textarea.scrollTop = Math.max(0, (line - 3) * lineHeight);
  }

  function wire(form) {
    const textarea = form.querySelector("textarea[name=config]");
    if (!textarea) return;
    textarea.addEventListener("input", () => showTypes(form));
    form.querySelectorAll("select[data-toml-table]").forEach((select) => {
      select.addEventListener("change", () => {
        textarea.value = withType(textarea.value, select.dataset.tomlTable, select.value);
      });
    });
    form.addEventListener("click", (event) => {
      const link = event.target.closest("[data-line] a.toml-line");
      if (!link) return;
      event.preventDefault();
      selectLine(textarea, Number(link.closest("[data-line]").dataset.line));
    });
    showTypes(form);
  }

  document.querySelectorAll("form.run-form").forEach(wire);
})();
