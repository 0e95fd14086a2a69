# Sourced by bootstrap.sh and bootstrap-vllm.sh once $VENV exists: defines pip_install ARGS..., which installs into
# $VENV with uv (pinned below, installed into the venv with pip), pip's arguments and semantics (-c, -r, -e,
# --no-deps), with bytecode compiled at install: the environment may set PYTHONDONTWRITEBYTECODE, and without .pyc
# files every process would recompile what it imports. Where uv cannot be installed (no network, no wheel for the
# platform) or NEMOTRON_PIP=1, pip installs, as it did before.
# NEMOTRON_COMPILE_BYTECODE=0 (.ci/run) compiles nothing at install; the run then leaves PYTHONDONTWRITEBYTECODE unset, so
# each module is compiled once, by its first import: a fresh venv holds about 26,000 modules (torch, transformers,
# ray, mlflow, ...), compiling all of them took about 4 CPU-minutes of CI's 2 cores, and the suite imports a few
# thousand.
# uv reads no pip.conf: pip_install hands it what pip is configured with here (`pip config list`: its files and PIP_*
# variables): index URLs, find-links (a CPU torch wheel may lie there) and constraint files, the local ones only where
# they exist. pip picks the best file across all its indexes; uv, for one version, takes the files of the first index
# that has it, and a partial mirror listed first would give other wheels (a py310 build where pip picks py311): so
# pip's main index (PyPI unless set) comes first, the extra ones after, and every index's versions count.
UV_VERSION=0.13.8
compile=(--compile-bytecode)
pip_compile=()
[ "${NEMOTRON_COMPILE_BYTECODE:-1}" != 0 ] || { compile=(); pip_compile=(--no-compile); }
uv_args=(--python "$VENV/bin/python" "${compile[@]}")
use_uv=0
if [ "${NEMOTRON_PIP:-0}" != 1 ]; then
  case $("$VENV/bin/uv" --version 2>/dev/null) in
    "uv $UV_VERSION"*) use_uv=1 ;;
    *) "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION" >/dev/null 2>&1 && use_uv=1 ;;
  esac
  [ $use_uv = 1 ] || echo "uv $UV_VERSION could not be installed into $VENV: installing with pip (slower)" >&2
fi
if [ $use_uv = 1 ]; then
  declare -A seen=()
  index_url=
  extra_urls=()
  while IFS= read -r line; do
    key=${line#*.}
    key=${key%%=*}
    values=${line#*=\'}
    read -ra values <<<"${values%\'}"
    for v in "${values[@]}"; do
      [ -z "${seen[$key $v]:-}" ] || continue
      seen[$key $v]=1
      case $key in index-url | extra-index-url | find-links | constraint)
        case $v in http://* | https://*) ;; *) [ -e "${v#file://}" ] || continue ;; esac ;;
      esac
      case $key in
        index-url) index_url=${index_url:-$v} ;;
        extra-index-url) extra_urls+=("$v") ;;
        find-links) uv_args+=(--find-links "$v") ;;
        constraint) uv_args+=(--constraints "$v") ;;
        no-index) case $v in 1 | true | yes | on) uv_args+=(--no-index) ;; esac ;;
        cert) export SSL_CERT_FILE=${SSL_CERT_FILE:-$v} ;;
        default-timeout) export UV_HTTP_TIMEOUT=${UV_HTTP_TIMEOUT:-$v} ;;
      esac
    done
  done < <("$VENV/bin/python" -m pip config list 2>/dev/null)
  if [ ${#extra_urls[@]} -gt 0 ]; then
    uv_args+=(--index-strategy unsafe-best-match --index "${index_url:-https://pypi.org/simple}")
    for v in "${extra_urls[@]}"; do uv_args+=(--index "$v"); done
  elif [ -n "$index_url" ]; then
    uv_args+=(--default-index "$index_url")
  fi
  unset seen index_url extra_urls
  pip_install() { "$VENV/bin/uv" pip install -q "${uv_args[@]}" "$@"; }
else
  # Some machines list package mirrors that do not exist on every host; pip warns once per package about each.
  pip_install() { "$VENV/bin/python" -m pip install -q "${pip_compile[@]}" "$@" 2> >(grep -v "WARNING: Location '" >&2); }
fi
