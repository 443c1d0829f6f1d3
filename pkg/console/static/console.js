// faultrouter operator console: live updates over server-sent events.
// Pages work without it; it greys out items someone else decided, adds new
// alerts to the feed, and moves progress bars.
(function () {
  "use strict";
  var es = new EventSource("/events");
  // A page left for another must give its stream back: browsers allow six
  // connections per host, and a page kept in the back-forward cache would
  // hold its stream open.
  window.addEventListener("pagehide", function () { es.close(); });
  window.addEventListener("pageshow", function (e) { if (e.persisted) { location.reload(); } });

  es.addEventListener("review", function (e) {
    var d = JSON.parse(e.data);
    var row = document.querySelector('#queue tr[data-task="' + CSS.escape(d.task_id) + '"]');
    if (!row) {
      if (d.state === "open" && document.getElementById("queue")) {
        document.getElementById("new-items").classList.remove("hidden");
      }
      return;
    }
    var state = row.querySelector(".state");
    if (d.state === "decided" || d.state === "closed") {
      row.classList.add("decided");
      row.querySelectorAll("form.decision button").forEach(function (b) { b.disabled = true; });
      if (state) {
        state.textContent = d.state === "closed"
          ? "closed by the router (" + d.outcome + ")" + (d.by ? ", decided by " + d.by : "")
          : "decided by " + d.by + " (" + (d.approve ? "approve" : "reject") + "), waiting for the router";
      }
    }
  });

  es.addEventListener("alert", function (e) {
    var feed = document.querySelector("#alerts tbody");
    if (!feed) { return; }
    var d = JSON.parse(e.data);
    var tr = document.createElement("tr");
    [d.time, d.kind, d.scope, d.key, d.change, d.class, d.task_id, d.reason, d.instance].forEach(function (v) {
      var td = document.createElement("td");
      td.textContent = v || "";
      tr.appendChild(td);
    });
    tr.className = "fresh";
    feed.insertBefore(tr, feed.firstChild);
  });

  es.addEventListener("progress", function (e) {
    var d = JSON.parse(e.data);
    var p = document.getElementById("progress");
    if (!p) { return; }
    if (d.caught_up) { p.remove(); return; }
    var r = document.getElementById("progress-read");
    if (r) { r.textContent = d.read; }
  });

  es.addEventListener("job", function (e) {
    var d = JSON.parse(e.data);
    var row = document.querySelector('#jobs tr[data-job="' + CSS.escape(d.id) + '"]');
    if (!row) { return; }
    var st = row.querySelector(".job-state");
    if (st) { st.textContent = d.state; }
    var pr = row.querySelector(".job-progress");
    if (pr) { pr.textContent = d.sent + " / " + d.total; }
  });

  es.addEventListener("deadletter", function () {
    var n = document.getElementById("new-deadletters");
    if (n) { n.classList.remove("hidden"); }
  });
})();
