// kafkatx console: live figures without reloading the page. The server renders every page with
// its data; this script only refreshes the numbers of the partitions and outbox tables from the
// JSON API every 5 seconds (same origin, the session cookie; no inline script anywhere).
(function () {
  "use strict";
  var base = document.body.dataset.base || "";
  var page = document.body.dataset.page;
  var stamp = document.getElementById("refreshed");

  function setCell(row, field, text) {
    var cell = row.querySelector('[data-f="' + field + '"]');
    if (!cell) return;
    if (field === "state") {
      var s = cell.querySelector(".state");
      if (s && s.textContent !== text) s.textContent = text;
      return;
    }
    if (cell.textContent !== text) cell.textContent = text;
  }

  function num(v) { return v < 0 ? "-" : String(v); }
  function signed(v) { return v === null || v === undefined ? "-" : (v > 0 ? "+" + v : String(v)); }

  function refreshPartitions() {
    var table = document.getElementById("partitions");
    if (!table) return;
    var params = new URLSearchParams(location.search);
    var url = base + "/api/partitions" + (params.get("group") ? "?group=" + encodeURIComponent(params.get("group")) : "");
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (rows) {
        var drifted = 0;
        rows.forEach(function (p) {
          if (p.drifted) drifted++;
          var tr = table.querySelector('tr[data-key="' + CSS.escape(p.group + "|" + p.topic + "|" + p.partition) + '"]');
          if (!tr) return;
          setCell(tr, "watermark", num(p.watermark));
          setCell(tr, "committed", num(p.committed));
          setCell(tr, "log_start", String(p.log_start));
          setCell(tr, "log_end", String(p.log_end));
          setCell(tr, "lag", String(p.lag));
          setCell(tr, "drift", signed(p.drift));
          setCell(tr, "state", p.state);
          setCell(tr, "next", p.next);
          tr.classList.toggle("drift", !!p.drifted);
        });
        var c = document.getElementById("drifted-count");
        if (c) { c.textContent = String(drifted); c.classList.toggle("drift", drifted > 0); }
        done();
      })
      .catch(failed);
  }

  function refreshOutbox() {
    var table = document.getElementById("backlog");
    if (!table) return;
    fetch(base + "/api/outbox", { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (v) {
        v.backlog.forEach(function (b) {
          var tr = table.querySelector('tr[data-key="' + CSS.escape(b.topic + "|" + b.state) + '"]');
          if (!tr) return;
          setCell(tr, "rows", String(b.rows));
          setCell(tr, "age_seconds", Math.round(b.age_seconds) + " s");
        });
        done();
      })
      .catch(failed);
  }

  function done() { if (stamp) stamp.textContent = "figures refreshed " + new Date().toLocaleTimeString(); }
  function failed(e) { if (stamp) stamp.textContent = "refresh failed (" + e.message + "): reload the page"; }

  function tick() {
    if (document.hidden) return;
    if (page === "partitions") refreshPartitions();
    if (page === "outbox") refreshOutbox();
  }
  setInterval(tick, 5000);
})();
