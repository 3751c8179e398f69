// cudaleak's HTML report. Written for this page: it draws the timeline,
// the flame graph (icicle) and the leak table from the JSON in
// #cudaleak-data with DOM calls only. Text from the report is set with
// textContent / createTextNode, never parsed as markup.
"use strict";
(function () {
  var errors = document.getElementById("errors");
  function showError(msg) {
    errors.appendChild(document.createTextNode(String(msg) + "\n"));
    document.body.setAttribute("data-rendered", "error");
  }
  window.onerror = function (msg, src, line, col) {
    showError("script error: " + msg + " (line " + line + ":" + col + ")");
  };
  window.addEventListener("unhandledrejection", function (e) { showError("script error: " + e.reason); });

  var SVG = "http://www.w3.org/2000/svg";
  var PALETTE = ["#e6550d", "#3182bd", "#31a354", "#756bb1", "#d6616b", "#e7ba52", "#17becf",
    "#8c6d31", "#bd9e39", "#637939", "#843c39", "#7b4173", "#5254a3"];
  var OTHER_COLOR = "#b0b7c3";

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function bytes(n) {
    var a = Math.abs(n), u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"], i = 0;
    while (a >= 1024 && i < u.length - 1) { a /= 1024; i++; }
    var s = (i === 0 ? String(a) : a.toFixed(a < 10 ? 2 : 1)) + " " + u[i];
    return (n < 0 ? "-" : "") + s;
  }
  function count(n, noun) { return n + " " + noun + (n === 1 ? "" : "s"); }
  function signedBytes(n) { return (n > 0 ? "+" : "") + bytes(n); }
  function frameText(f) { return f.name + (f.loc ? "  " + f.loc : ""); }

  // --- tooltip ---------------------------------------------------------
  var tip = document.getElementById("tooltip");
  function showTip(ev, title, lines) {
    tip.textContent = "";
    tip.appendChild(el("div", { "class": "tip-title" }, title));
    if (lines && lines.length) tip.appendChild(el("pre", null, lines.join("\n")));
    tip.hidden = false;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    if (x + w > window.innerWidth) x = Math.max(0, ev.clientX - w - 14);
    if (y + h > window.innerHeight) y = Math.max(0, ev.clientY - h - 14);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() { tip.hidden = true; }
  function stackLines(frames, max) {
    var out = [];
    for (var i = 0; i < frames.length && i < max; i++) out.push("#" + i + " " + frameText(frames[i]));
    if (frames.length > max) out.push("... " + count(frames.length - max, "more frame"));
    return out;
  }

  // --- header ------------------------------------------------------------
  function header(data) {
    document.getElementById("title").textContent = data.title;
    var facts = document.getElementById("facts");
    data.facts.forEach(function (f) {
      facts.appendChild(el("dt", null, f[0]));
      facts.appendChild(el("dd", null, f[1]));
    });
    document.getElementById("summary").textContent = data.summary;
  }

  // --- timeline: stacked areas of live bytes by call site ------------------
  function timeline(t) {
    var section = document.getElementById("timeline-section");
    if (!t || !t.t_ms.length) return;
    section.hidden = false;
    var box = document.getElementById("timeline");
    var W = 1000, H = 280, L = 72, R = 16, T = 22, B = 30;
    var svg = sv("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "live bytes over time" });
    var ts = t.t_ms, n = ts.length;
    var t0 = ts[0], t1 = ts[n - 1];
    // One point alone (a single dump) is drawn as a step from the left edge.
    if (t1 === t0) { t0 = t0 - 1000; }
    var ymax = 1;
    for (var i = 0; i < n; i++) {
      var s = 0;
      t.series.forEach(function (se) { s += se.values[i]; });
      ymax = Math.max(ymax, s, t.total[i]);
    }
    if (t.peak) ymax = Math.max(ymax, t.peak.bytes);
    var spike = t.peak && t.process_peak > t.peak.bytes ? t.process_peak : 0;
    ymax = Math.max(ymax, spike);
    ymax *= 1.08;
    function X(ms) { return L + (ms - t0) / (t1 - t0) * (W - L - R); }
    function Y(b) { return H - B - b / ymax * (H - T - B); }
    // grid and axes
    var axis = sv("g", { "class": "axis" });
    for (var k = 0; k <= 4; k++) {
      var v = ymax / 1.08 * k / 4, y = Y(v);
      axis.appendChild(sv("line", { "class": "grid", x1: L, x2: W - R, y1: y, y2: y }));
      axis.appendChild(sv("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, bytes(Math.round(v))));
    }
    axis.appendChild(sv("line", { x1: L, x2: W - R, y1: H - B, y2: H - B }));
    var span = (t1 - t0) / 1000;
    [0, 0.25, 0.5, 0.75, 1].forEach(function (f) {
      var ms = t0 + f * (t1 - t0);
      axis.appendChild(sv("text", { x: X(ms), y: H - B + 16, "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle" },
        (ms < ts[0] ? "" : "+") + ((ms - ts[0]) / 1000).toFixed(span < 10 ? 2 : 0) + " s"));
    });
    svg.appendChild(axis);
    // bands, bottom up: the largest site first
    var base = new Array(n).fill(0);
    var xs = ts.map(function (ms) { return X(ms); });
    if (n === 1) xs = [L, xs[0]];
    var legend = document.getElementById("timeline-legend");
    t.series.forEach(function (se, si) {
      var top = base.map(function (b, i) { return b + se.values[i]; });
      var pts = [];
      var lo = n === 1 ? [base[0], base[0]] : base, hi = n === 1 ? [top[0], top[0]] : top;
      // straight lines between points: nothing is known between samples,
      // and the last point must stay visible at the right edge
      for (var i = 0; i < xs.length; i++) pts.push([xs[i], Y(hi[i])]);
      for (var j = xs.length - 1; j >= 0; j--) pts.push([xs[j], Y(lo[j])]);
      var color = se.label === "other" ? OTHER_COLOR : PALETTE[si % PALETTE.length];
      var d = "M" + pts.map(function (p) { return p[0].toFixed(1) + "," + p[1].toFixed(1); }).join("L") + "Z";
      var path = sv("path", { "class": "series", d: d, fill: color, "data-label": se.label });
      path.addEventListener("mousemove", function (ev) {
        var rect = svg.getBoundingClientRect();
        var x = (ev.clientX - rect.left) / rect.width * W;
        var idx = 0;
        for (var i = 0; i < n; i++) if (X(ts[i]) <= x + 0.5) idx = i;
        showTip(ev, se.label + ": " + bytes(se.values[idx]) + " live at +" + ((ts[idx] - ts[0]) / 1000).toFixed(2) + " s",
          stackLines(se.stack, 24));
      });
      path.addEventListener("mouseleave", hideTip);
      svg.appendChild(path);
      base = top;
      var item = el("span", { "class": "legend-item" });
      item.appendChild(el("span", { "class": "swatch", style: "background:" + color }));
      item.appendChild(document.createTextNode(se.label + " (max " + bytes(Math.max.apply(null, se.values)) + ")"));
      legend.appendChild(item);
    });
    // dumps
    (t.marks || []).forEach(function (m) {
      var x = X(m.t_ms);
      var g = sv("g", { "class": "dump-marker trigger-" + m.trigger, "data-trigger": m.trigger });
      g.appendChild(sv("path", { d: "M" + (x - 5) + "," + (T - 12) + "L" + (x + 5) + "," + (T - 12) + "L" + x + "," + (T - 3) + "Z" }));
      g.appendChild(sv("line", { x1: x, x2: x, y1: T - 3, y2: H - B, stroke: "#888", "stroke-width": 0.6, "stroke-dasharray": "2 3" }));
      g.addEventListener("mousemove", function (ev) { showTip(ev, m.label, []); });
      g.addEventListener("mouseleave", hideTip);
      svg.appendChild(g);
    });
    // the process's peak, when a short spike put it above every point
    if (spike) {
      var sy = Y(spike);
      var sg = sv("g", { "class": "process-peak", "data-bytes": spike });
      sg.appendChild(sv("line", { x1: L, x2: W - R, y1: sy, y2: sy, stroke: "#b3261e", "stroke-width": 0.8, "stroke-dasharray": "1 3" }));
      sg.appendChild(sv("text", { x: W - R, y: sy - 4, "text-anchor": "end", fill: "#b3261e" },
        "process peak " + bytes(spike) + " (between " + (t.source === "sampler" ? "samples" : "dumps") + ")"));
      svg.appendChild(sg);
    }
    // the peak
    if (t.peak) {
      var px = X(t.peak.t_ms), py = Y(t.peak.bytes);
      var pg = sv("g", { "class": "peak-marker", "data-bytes": t.peak.bytes });
      pg.appendChild(sv("line", { x1: px, x2: px, y1: py, y2: H - B }));
      pg.appendChild(sv("circle", { cx: px, cy: py, r: 4, fill: "#b3261e" }));
      var right = px > W - 200;
      pg.appendChild(sv("text", { x: px + (right ? -8 : 8), y: Math.max(T + 2, py - 6), "text-anchor": right ? "end" : "start" },
        (spike ? "highest " + (t.source === "sampler" ? "sample " : "dump ") : "peak ") + bytes(t.peak.bytes)));
      pg.addEventListener("mousemove", function (ev) {
        showTip(ev, "peak: " + bytes(t.peak.bytes) + " live", t.peak.sites.map(function (s) { return bytes(s.bytes) + "  " + s.label; }));
      });
      pg.addEventListener("mouseleave", hideTip);
      svg.appendChild(pg);
    }
    box.appendChild(svg);
    if (n === 1) box.appendChild(el("p", { "class": "empty" },
      "One point only: this report holds no sampled timeline (CUDALEAK_TIMELINE) and no earlier dumps were given."));
  }

  // --- flame graph (icicle), root at the top ------------------------------
  function flame(data) {
    var box = document.getElementById("flame");
    document.getElementById("flame-title").textContent = "Flame graph of " + data.weight + " (root at the top; click to zoom)";
    var root = { name: "all", loc: null, value: 0, children: [], byName: {}, depth: 0 };
    data.groups.forEach(function (g) {
      if (!(g.bytes > 0) || g.uncounted) return;
      root.value += g.bytes;
      var node = root;
      var path = g.frames.slice().reverse().concat([{ name: g.api + " (" + g.memory + ")", loc: null, python: false, leaf: true }]);
      path.forEach(function (f) {
        // Merged by name, as flame graphs do: one box for a function
        // whichever of its lines made the call.
        var key = (f.python ? "py:" : "c:") + f.name;
        var c = node.byName[key];
        if (!c) {
          c = { name: f.name, loc: f.python || f.leaf ? f.loc : (f.loc || "").replace(/:\d+$/, ""), python: f.python, leaf: !!f.leaf, value: 0, children: [], byName: {}, parent: node, depth: node.depth + 1 };
          node.byName[key] = c;
          node.children.push(c);
        }
        c.value += g.bytes;
        node = c;
      });
    });
    if (!root.value) {
      box.appendChild(el("p", { "class": "empty" }, "Nothing to draw: no " + data.weight + "."));
      return;
    }
    var maxDepth = 0;
    (function walk(n) { maxDepth = Math.max(maxDepth, n.depth); n.children.sort(function (a, b) { return b.value - a.value; }); n.children.forEach(walk); })(root);
    var W = 1000, ROW = 18;
    var svg = sv("svg", { viewBox: "0 0 " + W + " " + ((maxDepth + 1) * ROW + 2), role: "img", "aria-label": "flame graph" });
    box.appendChild(svg);
    var search = document.getElementById("flame-search");
    var matchInfo = document.getElementById("flame-match");
    var focus = root;
    function color(n) {
      if (n.leaf) return "#e8a33d";
      var h = 0;
      for (var i = 0; i < n.name.length; i++) h = (h * 31 + n.name.charCodeAt(i)) >>> 0;
      return n.python ? "hsl(" + (95 + h % 40) + ",50%," + (58 + h % 12) + "%)" : "hsl(" + (8 + h % 32) + ",80%," + (58 + h % 12) + "%)";
    }
    function draw() {
      svg.textContent = "";
      var re = null;
      if (search.value) {
        try { re = new RegExp(search.value, "i"); } catch (e) { re = null; }
      }
      var matched = 0;
      var ancestors = {};
      for (var a = focus; a; a = a.parent) ancestors[a.depth] = a;
      function place(n, x, w) {
        var onPath = n.depth < focus.depth;
        if (onPath && ancestors[n.depth] !== n) return;
        if (w < 0.3) return;
        var isMatch = re && n !== root && re.test(n.name + " " + (n.loc || ""));
        var g = sv("g", { "class": "frame" + (isMatch ? " match" : "") + (onPath ? " faded" : ""), "data-name": n.name });
        g.appendChild(sv("rect", { x: x.toFixed(2), y: n.depth * ROW, width: Math.max(0, w - 0.5).toFixed(2), height: ROW - 1, fill: n === root ? "#c9ced8" : color(n) }));
        var label = n === root ? "all: " + bytes(n.value) : n.name;
        var chars = Math.floor((w - 6) / 6.6);
        if (chars >= 3) g.appendChild(sv("text", { x: (x + 3).toFixed(2), y: n.depth * ROW + 13 }, label.length > chars ? label.slice(0, chars - 1) + "\u2026" : label));
        g.addEventListener("click", function () { focus = n; draw(); });
        g.addEventListener("mousemove", function (ev) {
          showTip(ev, n.name + (n.loc ? "  " + n.loc : ""), [bytes(n.value) + " (" + (100 * n.value / root.value).toFixed(1) + "% of " + data.weight + ")"]);
        });
        g.addEventListener("mouseleave", hideTip);
        svg.appendChild(g);
        if (isMatch) matched += n.value;
        var cx = x;
        var scale = w / n.value;
        n.children.forEach(function (c) {
          var cw = c.value * scale;
          place(c, cx, cw);
          cx += cw;
        });
      }
      // Ancestors of the focus span the full width; the focus too.
      (function placeFrom(n) {
        if (n === focus) { place(n, 0, W); return; }
        var g = sv("g", { "class": "frame faded", "data-name": n.name });
        g.appendChild(sv("rect", { x: 0, y: n.depth * ROW, width: W - 0.5, height: ROW - 1, fill: n === root ? "#c9ced8" : color(n) }));
        g.appendChild(sv("text", { x: 3, y: n.depth * ROW + 13 }, n === root ? "all: " + bytes(n.value) : n.name));
        g.addEventListener("click", function () { focus = n; draw(); });
        svg.appendChild(g);
        placeFrom(ancestors[n.depth + 1]);
      })(root);
      matchInfo.textContent = re ? "matched: " + bytes(Math.min(matched, focus.value)) + " of " + bytes(focus.value) : "";
    }
    search.addEventListener("input", draw);
    document.getElementById("flame-reset").addEventListener("click", function () { focus = root; search.value = ""; draw(); });
    draw();
  }

  // --- the table ----------------------------------------------------------
  function table(data) {
    var wrap = document.getElementById("table-wrap");
    var title = document.getElementById("table-title");
    var cols;
    if (data.kind === "diff") {
      title.textContent = "Changes, stack by stack";
      cols = [
        { key: "change", label: "change", badge: true },
        { key: "bytes_delta", label: "\u0394 bytes", num: true, fmt: signedBytes },
        { key: "blocks_delta", label: "\u0394 blocks", num: true, fmt: function (v) { return (v > 0 ? "+" : "") + v; } },
        { key: "old_bytes", label: "old", num: true, fmt: bytes },
        { key: "new_bytes", label: "new", num: true, fmt: bytes }];
    } else {
      title.textContent = data.kind === "report" && data.weight === "live bytes" ? "Live memory by call site" : "Leaks";
      cols = [
        { key: "bytes", label: "size", num: true, fmt: bytes },
        { key: "blocks", label: "blocks", num: true }];
    }
    cols = cols.concat([
      { key: "api", label: "API" },
      { key: "memory", label: "memory" }]);
    // Trends exist only where a process was dumped more than once.
    var anyTrend = data.groups.some(function (g) { return g.trend; });
    if (data.kind !== "diff" && anyTrend) cols.push({ key: "trend", label: "trend", badge: true });
    if (data.kind === "merge") cols.push({ key: "ranks", label: "on", fmt: function (v, g) { return (g.only_some ? "only " : "all: ") + v.join(", "); } });
    cols.push({ key: "site", label: "call site" });
    var rows = data.groups.map(function (g, i) {
      var site = g.frames.length ? g.frames[0] : null;
      for (var j = 0; j < g.frames.length; j++) if (g.frames[j].python) { site = g.frames[j]; break; }
      var r = Object.assign({}, g);
      r.site = site ? frameText(site) : "(no stack recorded)";
      r.index = i;
      return r;
    });
    var t = el("table", { id: "leaks" });
    var thead = el("thead"), hr = el("tr");
    var sortKey = null, sortDir = -1;
    cols.forEach(function (c) {
      var th = el("th", { "class": c.num ? "num" : "", "data-key": c.key, scope: "col" }, c.label);
      th.addEventListener("click", function () {
        if (sortKey === c.key) sortDir = -sortDir; else { sortKey = c.key; sortDir = c.num ? -1 : 1; }
        Array.prototype.forEach.call(hr.children, function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
        th.classList.add(sortDir > 0 ? "sorted-asc" : "sorted-desc");
        rows.sort(function (a, b) {
          var x = a[c.key], y = b[c.key];
          if (x === y) return a.index - b.index;
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          return (x < y ? -1 : 1) * sortDir;
        });
        fill();
      });
      hr.appendChild(th);
    });
    thead.appendChild(hr);
    t.appendChild(thead);
    var tbody = el("tbody");
    t.appendChild(tbody);
    var open = {};
    function fill() {
      tbody.textContent = "";
      rows.forEach(function (r) {
        var tr = el("tr", { "class": "leak-row" + (open[r.index] ? " open" : ""), "data-index": r.index });
        cols.forEach(function (c) {
          var v = r[c.key];
          var td = el("td", { "class": c.num ? "num" : "" });
          if (c.badge) {
            if (v) td.appendChild(el("span", { "class": "badge " + v }, v));
          } else {
            td.textContent = v === null || v === undefined ? "" : c.fmt ? c.fmt(v, r) : String(v);
          }
          if (c.key === "bytes" || c.key === "bytes_delta") td.title = String(v) + " bytes";
          tr.appendChild(td);
        });
        tr.addEventListener("click", function () { open[r.index] = !open[r.index]; fill(); });
        tbody.appendChild(tr);
        if (open[r.index]) {
          var dr = el("tr", { "class": "detail" });
          var td = el("td", { colspan: cols.length });
          var ol = el("ol", { "class": "stack", start: 0 });
          r.frames.forEach(function (f, i) {
            var li = el("li", { "class": f.python ? "py" : "native" });
            li.appendChild(document.createTextNode("#" + i + " " + f.name + (f.python ? " [python]" : "")));
            if (f.loc) li.appendChild(el("span", { "class": "loc" }, "  " + f.loc));
            ol.appendChild(li);
          });
          if (!r.frames.length) ol.appendChild(el("li", null, "(no stack recorded)"));
          if (r.frames_cut) ol.appendChild(el("li", null, "... " + count(r.frames_cut, "innermost frame") + " not shown"));
          td.appendChild(ol);
          dr.appendChild(td);
          tbody.appendChild(dr);
        }
      });
    }
    fill();
    var tfoot = el("tfoot"), fr = el("tr", { id: "totals-row" });
    cols.forEach(function (c, i) {
      var td = el("td", { "class": c.num ? "num" : "" });
      if (c.num) {
        var sum = 0;
        data.groups.forEach(function (g) { if (!(c.key === "bytes" && g.uncounted)) sum += g[c.key] || 0; });
        td.textContent = c.fmt ? c.fmt(sum, {}) : String(sum);
        td.setAttribute("data-sum", sum);
        td.setAttribute("data-key", c.key);
      } else if (i === cols.length - 1) {
        td.textContent = count(data.groups.length, "group") + (data.groups_cut ? " (and " + data.groups_cut + " more not shown)" : "");
      } else if (i === 0 && !c.num) {
        td.textContent = "total";
      }
      fr.appendChild(td);
    });
    tfoot.appendChild(fr);
    t.appendChild(tfoot);
    if (!data.groups.length) wrap.appendChild(el("p", { "class": "empty" }, "No leaks."));
    wrap.appendChild(t);
  }

  // --- ranks side by side (merge) ----------------------------------------
  function ranks(data) {
    if (!data.ranks || !data.ranks.length) return;
    document.getElementById("ranks-section").hidden = false;
    var box = el("div", { "class": "ranks" });
    var max = 1;
    data.ranks.forEach(function (r) { max = Math.max(max, r.leaked_bytes); });
    data.ranks.forEach(function (r) {
      var d = el("div", { "class": "rank" + (r.outlier ? " outlier" : ""), "data-label": r.label });
      var h = el("div", null);
      h.appendChild(el("strong", null, r.label));
      if (r.outlier) { h.appendChild(document.createTextNode(" ")); h.appendChild(el("span", { "class": "badge odd" }, "odd one out")); }
      d.appendChild(h);
      d.appendChild(el("div", { "class": "mono" }, bytes(r.leaked_bytes) + " in " + count(r.leaked_blocks, "block") + ", " + count(r.groups, "group")));
      d.appendChild(el("div", { "class": "mono" }, "pid " + r.pid + (r.hostname ? " on " + r.hostname : "")));
      var bar = el("div", { "class": "bar" }), fill = el("div");
      fill.style.width = (100 * r.leaked_bytes / max).toFixed(1) + "%";
      bar.appendChild(fill);
      d.appendChild(bar);
      box.appendChild(d);
    });
    document.getElementById("ranks").appendChild(box);
  }

  try {
    var data = JSON.parse(document.getElementById("cudaleak-data").textContent);
    // Frames are stored once (data.frames) and referred to by index.
    var resolve = function (ix) { return ix.map(function (i) { return data.frames[i]; }); };
    data.groups.forEach(function (g) { g.frames = resolve(g.frames); });
    if (data.timeline) data.timeline.series.forEach(function (s) { s.stack = resolve(s.stack); });
    header(data);
    ranks(data);
    timeline(data.timeline);
    flame(data);
    table(data);
    if (document.body.getAttribute("data-rendered") !== "error") document.body.setAttribute("data-rendered", "ok");
  } catch (e) {
    showError("cannot draw this report: " + (e && e.stack ? e.stack : e));
  }
})();
