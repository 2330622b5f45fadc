// dtflab's placement board: a box per device, a chip per variable (sized by its bytes), ps
// load bars, strategy buttons, undo, and the measured cost of each change. Buildless ES module
// for anywidget: the kernel holds the plan; this view sends moves and draws what it is told.
//
// Model traits (from dtflab/ui/placement_widget.py): devices [{device, name}], chips [{name,
// shape, bytes, device}], loads {device: bytes}, imbalance, strategies [[key, label]],
// history [{change, bytes, step_ms, imbalance}], status. Messages to the kernel:
// {kind: "move", name, device}, {kind: "strategy", strategy}, {kind: "undo"}.

const fmt = (n) => n.toLocaleString("en-US");
const kib = (n) => (n >= 1024 ? `${(n / 1024).toFixed(n >= 10240 ? 0 : 1)} KiB` : `${n} B`);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-") || key === "tabindex" || key === "role" || key.startsWith("aria-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) node.append(child);
  return node;
}

function render({ model, el: root }) {
  root.classList.add("dtflab-placement");
  const toolbar = el("div", { class: "dtflab-toolbar" });
  const board = el("div", { class: "dtflab-board" });
  const summary = el("div", { class: "dtflab-summary" });
  const history = el("table", { class: "dtflab-history" });
  root.append(toolbar, board, summary, history);
  let dragging = null; // {name, ghost, chip}

  const move = (name, device) => {
    const chip = model.get("chips").find((c) => c.name === name);
    if (chip && chip.device !== device) model.send({ kind: "move", name, device });
  };

  function drawToolbar() {
    toolbar.replaceChildren();
    for (const [key, label] of model.get("strategies")) {
      const button = el("button", { class: "dtflab-strategy", textContent: label, "data-strategy": key });
      button.addEventListener("click", () => model.send({ kind: "strategy", strategy: key }));
      toolbar.append(button);
    }
    const undo = el("button", { class: "dtflab-undo", textContent: "Undo", disabled: !model.get("can_undo") });
    undo.addEventListener("click", () => model.send({ kind: "undo" }));
    toolbar.append(undo, el("span", { class: "dtflab-status", textContent: model.get("status") }));
  }

  function drawBoard() {
    board.replaceChildren();
    const devices = model.get("devices");
    const chips = model.get("chips");
    const loads = model.get("loads");
    const most = Math.max(1, ...Object.values(loads));
    const biggest = Math.max(1, ...chips.map((c) => c.bytes));
    devices.forEach((device, index) => {
      const load = loads[device.device] || 0;
      const box = el("div", { class: "dtflab-device", "data-device": device.name, "data-full": device.device },
        el("div", { class: "dtflab-device-name", textContent: `${index + 1} · ${device.name}` }),
        el("div", { class: "dtflab-load" }, el("div", { class: "dtflab-load-bar", style: "" })),
        el("div", { class: "dtflab-load-text", textContent: `${fmt(load)} bytes` }));
      box.querySelector(".dtflab-load-bar").style.width = `${(100 * load) / most}%`;
      const holder = el("div", { class: "dtflab-chips" });
      for (const chip of chips.filter((c) => c.device === device.device)) {
        const node = el("div", {
          class: "dtflab-chip", "data-variable": chip.name, tabindex: "0", role: "button",
          title: `${chip.name} ${chip.shape}: ${fmt(chip.bytes)} bytes. Drag it to another device, or press 1-${devices.length} or the arrow keys.`,
          "aria-label": `${chip.name} on ${device.name}`,
        }, el("b", { textContent: chip.name }), el("span", { textContent: ` ${chip.shape} · ${kib(chip.bytes)}` }));
        node.style.minWidth = `${50 + 110 * Math.sqrt(chip.bytes / biggest)}px`;
        node.addEventListener("pointerdown", (event) => startDrag(event, chip, node));
        node.addEventListener("keydown", (event) => {
          const at = devices.findIndex((d) => d.device === chip.device);
          let to = null;
          if (event.key >= "1" && event.key <= "9") to = Number(event.key) - 1;
          else if (event.key === "ArrowRight") to = (at + 1) % devices.length;
          else if (event.key === "ArrowLeft") to = (at - 1 + devices.length) % devices.length;
          if (to !== null && devices[to]) {
            event.preventDefault();
            move(chip.name, devices[to].device);
          }
        });
        holder.append(node);
      }
      box.append(holder);
      board.append(box);
    });
    summary.textContent = `imbalance ${model.get("imbalance").toFixed(2)} (largest over mean bytes per parameter server; 1.00 is even)`;
  }

  function startDrag(event, chip, node) {
    if (event.button !== 0) return;
    event.preventDefault();
    const ghost = node.cloneNode(true);
    ghost.classList.add("dtflab-ghost");
    document.body.append(ghost);
    dragging = { name: chip.name, ghost };
    node.classList.add("dtflab-dragged");
    placeGhost(event);
    window.addEventListener("pointermove", placeGhost);
    window.addEventListener("pointerup", endDrag, { once: true });
  }

  function target(event) {
    const under = document.elementFromPoint(event.clientX, event.clientY);
    return under ? under.closest(".dtflab-device") : null;
  }

  function placeGhost(event) {
    if (!dragging) return;
    dragging.ghost.style.left = `${event.clientX + 6}px`;
    dragging.ghost.style.top = `${event.clientY + 6}px`;
    for (const box of board.querySelectorAll(".dtflab-device")) box.classList.toggle("dtflab-over", box === target(event));
  }

  function endDrag(event) {
    window.removeEventListener("pointermove", placeGhost);
    if (!dragging) return;
    const box = target(event);
    dragging.ghost.remove();
    const name = dragging.name;
    dragging = null;
    for (const node of board.querySelectorAll(".dtflab-dragged, .dtflab-over")) node.classList.remove("dtflab-dragged", "dtflab-over");
    if (box) move(name, box.dataset.full);
  }

  function drawHistory() {
    const rows = model.get("history");
    history.replaceChildren(el("tr", {}, ...["change", "bytes between tasks", "step ms", "imbalance"].map((h) => el("th", { textContent: h }))));
    rows.forEach((row, i) => {
      const previous = rows[i - 1];
      const delta = previous ? row.bytes - previous.bytes : 0;
      history.append(el("tr", { class: "dtflab-history-row" },
        el("td", { textContent: row.change }),
        el("td", { class: "dtflab-bytes", textContent: fmt(row.bytes) + (previous ? ` (${delta >= 0 ? "+" : ""}${fmt(delta)})` : "") }),
        el("td", { textContent: row.step_ms.toFixed(1) }),
        el("td", { textContent: row.imbalance.toFixed(2) })));
    });
  }

  drawToolbar();
  drawBoard();
  drawHistory();
  model.on("change:chips", drawBoard);
  model.on("change:loads", drawBoard);
  model.on("change:devices", drawBoard);
  model.on("change:imbalance", drawBoard);
  model.on("change:history", drawHistory);
  model.on("change:status", drawToolbar);
  model.on("change:can_undo", drawToolbar);
  return () => { if (dragging) dragging.ghost.remove(); };
}

export default { render };
