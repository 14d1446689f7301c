// Live GPU charts and fleet tiles, fed by /ws/metrics/... websockets.
//
// - [data-live-session]: charts of one session's slice (last 15 minutes, one point a second).
// - [data-history]: a session's per-minute history, drawn once from the page's JSON.
// - #fleet-tiles: one tile per GPU and MIG device, updated in place (staff).
// Memory stays flat however long a page is open: each series is a ring of at most 900 points.
// Every value in a frame is data, never markup: anything a frame carries reaches the page
// as text (el() below), so a host name like "<img onerror=...>" shows literally.
(function () {
  "use strict";
  // 15 minutes at one frame a second; a page (or a test) may set a shorter ring before this script runs.
  var WINDOW = window.PORTAL_CHART_POINTS || 900;
  var FIGURES = [
    {key: "util", label: "Utilization", unit: "%", color: "#2563eb", max: 100},
    {key: "mem", label: "Memory", unit: "GiB", color: "#7c3aed"},
    {key: "temp", label: "Temperature", unit: "°C", color: "#dc2626"},
    {key: "power", label: "Power", unit: "W", color: "#d97706"}
  ];

  // Frames over the portal's one reconnecting websocket (static/js/portal.js).
  function live(path, onFrame, onState) {
    window.Portal.liveSocket(path, function (frame) { if (frame.kind) { onFrame(frame); } }, onState);
  }

  // An element with a class and children (nodes, strings or lists of them). Strings become
  // text nodes, never markup; null and false are left out.
  function el(tag, className) {
    var node = document.createElement(tag);
    if (className) { node.className = className; }
    (function add(children) {
      children.forEach(function (child) {
        if (Array.isArray(child)) { add(child); } else if (child !== null && child !== undefined && child !== false) {
          node.append(child instanceof Node ? child : String(child));
        }
      });
    })(Array.prototype.slice.call(arguments, 2));
    return node;
  }

  // A figure is a number or null ("not reported"); anything else a frame carries counts as not reported.
  function number(value) {
    return typeof value === "number" && isFinite(value) ? value : null;
  }

  function gib(mib) {
    return number(mib) === null ? null : mib / 1024;
  }

  function list(value) {
    return Array.isArray(value) ? value : [];
  }

  function fmt(value, unit) {
    value = number(value);
    return value === null ? "n/a" : (Math.round(value * 10) / 10) + " " + unit;
  }

  function percent(value, missing) {
    value = number(value);
    return value === null ? missing : Math.round(value) + "%";
  }

  function chart(target, figure, height, data) {
    var opts = {
      width: Math.max(target.clientWidth, 200), height: height,
      legend: {show: false}, cursor: {show: false},
      scales: {x: {time: true}, y: figure.max ? {range: [0, figure.max]} : {range: function (u, lo, hi) { return [0, Math.max(hi * 1.2, 1)]; }}},
      axes: [{size: 28, font: "11px system-ui"}, {size: 44, font: "11px system-ui"}],
      series: [{}, {label: figure.label, stroke: figure.color, fill: figure.color + "22", width: 1.5, spanGaps: false}]
    };
    var plot = new window.uPlot(opts, data, target);
    // Follow the panel's width (window resizes, the grid reflowing); the height stays.
    if (window.ResizeObserver) {
      new window.ResizeObserver(function () {
        var width = Math.max(target.clientWidth, 200);
        if (width !== plot.width) { plot.setSize({width: width, height: height}); }
      }).observe(target);
    }
    return plot;
  }

  // Lay out one captioned panel per figure first, then draw: each chart takes its panel's width.
  function panels(box, figures, caption) {
    var areas = {};
    figures.forEach(function (figure) {
      var area = el("div", "chart-area");
      box.appendChild(el("figure", "chart", el("figcaption", null, caption(figure)), area));
      areas[figure.key] = area;
    });
    return areas;
  }

  // One session's live charts: a ring of points per figure, redrawn in place.
  function sessionCharts(box) {
    var session = Number(box.dataset.liveSession);
    var compact = box.hasAttribute("data-compact");
    var figures = compact ? FIGURES.slice(0, 1) : FIGURES;
    var height = compact ? 70 : 130;
    var times = [], series = {}, plots = {}, points = 0;
    var areas = panels(box, figures, function (figure) {
      var out = el("output", null, "…");
      out.dataset.figure = figure.key;
      return [figure.label + " ", out];
    });
    figures.forEach(function (figure) {
      series[figure.key] = [];
      plots[figure.key] = chart(areas[figure.key], figure, height, [[], []]);
    });
    var status = document.querySelector("[data-live-status='" + session + "']");
    function onFrame(frame) {
      var mine = list(frame.devices).filter(function (d) { return d && d.session === session; })[0];
      if (!mine) { return; }
      var values = {util: number(mine.util), mem: gib(mine.mem_used), temp: number(mine.temp), power: number(mine.power)};
      times.push(frame.t);
      if (times.length > WINDOW) { times.shift(); }
      figures.forEach(function (figure) {
        var list = series[figure.key];
        list.push(values[figure.key]);
        if (list.length > WINDOW) { list.shift(); }
        plots[figure.key].setData([times, list]);
        var out = box.querySelector("output[data-figure='" + figure.key + "']");
        if (out) { out.textContent = fmt(values[figure.key], figure.unit); }
      });
      points += 1;
      box.dataset.points = String(points);
      box.dataset.held = String(times.length);
      box.dataset.lastUtil = String(values.util);
    }
    // No frame after a few seconds: say so instead of an empty chart (the GPU agent may not be running).
    window.setTimeout(function () {
      if (points) { return; }
      box.querySelectorAll("output[data-figure]").forEach(function (out) { out.textContent = "no figures yet"; });
    }, 5000);
    live("/ws/metrics/sessions/" + session + "/", onFrame, function (state) {
      box.dataset.state = state;
      if (status) { status.textContent = {live: "live", reconnecting: "reconnecting…", "logged-out": "log in again to see live figures", forbidden: "not yours"}[state] || state; }
    });
  }

  function historyChart(box) {
    var rows = JSON.parse(document.getElementById(box.dataset.history).textContent);
    if (!rows.length) { box.replaceChildren(el("p", "muted", "No history yet: the first minute is stored when it ends.")); return; }
    var times = rows.map(function (r) { return r.t; });
    var areas = panels(box, FIGURES, function (figure) { return figure.label + " (per-minute mean, " + figure.unit + ")"; });
    FIGURES.forEach(function (figure) {
      var values = rows.map(function (r) { return figure.key === "mem" ? gib(r.mem_used) : number(r[figure.key]); });
      chart(areas[figure.key], figure, 110, [times, values]);
    });
  }

  // Fleet tiles: one per GPU, with its MIG devices; colour follows utilisation.
  function heat(util) {
    util = number(util);
    if (util === null) { return "var(--tile-none)"; }
    var hue = 210 - Math.round(Math.min(util, 100) * 2.1);
    return "hsl(" + hue + " 70% " + (92 - util * 0.35) + "%)";
  }

  // The render job page's address for job 0, from the tiles' element; a holding job's id takes its place.
  var renderJobUrl = "";

  function jobLink(job, label) {
    var id = Number(job);
    if (!renderJobUrl || !Number.isInteger(id) || id <= 0) { return String(label); }
    var link = el("a", null, String(label));
    link.href = renderJobUrl.replace(/\/0\/$/, "/" + id + "/");
    return link;
  }

  // Who holds a device: "alice #12" for a notebook session, "alice · Render job #5" (a link) for a render job.
  function who(users) {
    users = list(users).filter(Boolean);
    if (!users.length) { return "free"; }
    var parts = [];
    users.forEach(function (u, index) {
      if (index) { parts.push(", "); }
      if (u.job) {
        parts.push(u.user + " · ", jobLink(u.job, u.label || "Render job #" + Number(u.job)));
      } else {
        parts.push(u.user + (u.session ? " #" + u.session : (u.holder ? " (" + u.holder + ")" : "")));
      }
    });
    return parts;
  }

  function deviceItem(d) {
    var item = el("li", null,
      el("strong", null, d.profile), " ",
      percent(d.util, "util n/a") + " · " + fmt(gib(d.mem_used), "GiB"),
      el("br"), el("span", "muted", who(d.users)));
    item.style.background = heat(d.util);  // CSSOM, which the page's style-src allows; a style="" attribute it would not
    return item;
  }

  function tileContent(gpu, simulated) {
    var figures = "util " + percent(gpu.util, "per device") + " · mem " +
      fmt(gib(gpu.mem_used), "GiB") + " / " + fmt(gib(gpu.mem_total), "GiB") + " · " + fmt(gpu.temp, "°C") +
      " · " + fmt(gpu.power, "W");
    var devices = list(gpu.devices).filter(Boolean);
    return [
      el("header", null, el("strong", null, gpu.host + " GPU " + gpu.index), " " + gpu.model,
        simulated ? " " : null, simulated ? el("span", "badge warn", "simulated") : null),
      gpu.problem ? el("p", "error", gpu.problem) : null,
      el("p", null, figures),
      devices.length ? el("ul", "mig-devices", devices.map(deviceItem)) : el("p", "muted", who(gpu.users))
    ].filter(Boolean);
  }

  var STALE_AFTER_S = 5;  // a tick is a second: five without a frame and the tile is no longer live

  function fleetTiles(root) {
    renderJobUrl = root.dataset.renderJobUrl || "";
    var tiles = new Map();  // a Map, not an object: a UUID is the frame's word, "__proto__" included
    function tileFor(gpu) {
      var tile = tiles.get(gpu.uuid);
      if (!tile) {
        tile = el("article", "gpu-tile");
        tile.dataset.uuid = gpu.uuid;
        root.appendChild(tile);
        tiles.set(gpu.uuid, tile);
      }
      return tile;
    }
    function onFrame(frame) {
      if (frame.kind !== "fleet") { return; }
      // When its figures were sampled, by this browser's clock: a frame the server marked stale says its age.
      var heard = Date.now() / 1000 - (typeof frame.age === "number" ? frame.age : 0);
      list(frame.gpus).filter(Boolean).forEach(function (gpu) {
        var tile = tileFor(gpu);
        tile.dataset.heard = String(heard);
        tile.style.background = heat(gpu.util);
        tile.replaceChildren.apply(tile, tileContent(gpu, frame.simulated));
        markStale(tile);
      });
      root.dataset.frames = String(Number(root.dataset.frames || 0) + 1);
    }
    // A tile whose agent went quiet is greyed and says since when: its last figures are never shown as live.
    function markStale(tile) {
      var age = Date.now() / 1000 - Number(tile.dataset.heard || 0);
      var stale = age > STALE_AFTER_S;
      tile.classList.toggle("stale", stale);
      var note = tile.querySelector(".stale-note");
      if (!stale) { if (note) { note.remove(); } return; }
      if (!note) { note = el("p", "stale-note"); tile.insertBefore(note, tile.children[1] || null); }
      note.textContent = "No figures for " + Math.round(age) + " s: its agent is quiet; these are the last it sent.";
    }
    window.setInterval(function () { tiles.forEach(markStale); }, 1000);
    var status = document.querySelector("[data-fleet-status]");
    live("/ws/metrics/fleet/", onFrame, function (state) { if (status) { status.textContent = state; } });
  }

  function startCharts() {
    if (!window.uPlot || !window.WebSocket || !window.Portal) { return; }
    document.querySelectorAll("[data-live-session]").forEach(function (box) {
      if (!box.dataset.started) { box.dataset.started = "1"; sessionCharts(box); }
    });
  }

  function start() {
    startCharts();
    if (window.uPlot) { document.querySelectorAll("[data-history]").forEach(historyChart); }
    var tiles = document.getElementById("fleet-tiles");
    if (tiles && window.WebSocket && window.Portal) { fleetTiles(tiles); }
  }
  // Session cards are swapped by htmx; their chart boxes are kept (hx-preserve), new ones start here.
  document.addEventListener("htmx:afterSettle", startCharts);
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();
