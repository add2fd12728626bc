# Sourced by build.sh and root.sh: no side effects.
# The mirror of the host's own Debian suite (VERSION_CODENAME): the first URI of a deb822 entry in
# sources.list.d/*.sources whose Suites include it, else of a one-line `deb URI SUITE` entry.
host_mirror() {
  local suite; suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$suite" ] || return 0
  local f; for f in /etc/apt/sources.list.d/*.sources; do [ -f "$f" ] && { cat "$f"; echo; }; done | awk -v want="$suite" '
    function has(list, w,   n, a, i) { n = split(list, a, /[ \t]+/); for (i = 1; i <= n; i++) if (a[i] == w) return 1; return 0 }
    function entry(   u) {
      if (!done && has(f["types"], "deb") && has(f["suites"], want) && tolower(f["enabled"]) !~ /no/) {
        u = f["uris"]; sub(/^[ \t]+/, "", u); sub(/[ \t].*/, "", u); if (u != "") { print u; done = 1 }
      }
      delete f; key = ""
    }
    /^#/ { next }
    /^[ \t]*$/ { entry(); next }
    /^[ \t]/ { if (key != "") f[key] = f[key] " " $0; next }
    { key = tolower($0); sub(/:.*/, "", key); v = $0; sub(/^[^:]*:/, "", v); f[key] = v }
    END { entry() }' | head -1 | grep . && return 0
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v want="$suite" '
    $1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }; if ($(i + 1) == want) { print $i; exit } }'
  return 0
}
