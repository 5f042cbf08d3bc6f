// Refreshes the page's <main> in place every data-refresh seconds while "live" is ticked: the server
// renders the fragment (header x-gpuyard-fragment), so the page stays server-rendered.
(function () {
  const main = document.getElementById("content");
  const live = document.getElementById("live");
  const seconds = Number(main && main.dataset.refresh);
  if (!main || !live || !seconds) return;
  async function refresh() {
    if (live.checked && !document.hidden && !main.querySelector("details[open]")) {
      try {
        const response = await fetch(location.href, { headers: { "x-gpuyard-fragment": "1" } });
        if (response.redirected) { location.href = response.url; return; }
        if (response.ok) main.innerHTML = await response.text();
      } catch (error) { /* the next tick tries again */ }
    }
    setTimeout(refresh, seconds * 1000);
  }
  setTimeout(refresh, seconds * 1000);
})();
