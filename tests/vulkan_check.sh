#!/usr/bin/env bash
# Builds llama-cpp-python with llama.cpp's Vulkan backend into .venv-vulkan (beside .venv) and
# runs ngramspec on it: a non-CPU device, here Mesa's software Vulkan driver (lavapipe), so the
# check runs on any machine. Shows what ngramspec does with a GPU build (docs/exactness.md,
# "Builds with a GPU backend"): its kernels turned off with a reason, -ngl 0 runs everything on
# the CPU with spec-on output equal to spec-off, -ngl 99 is refused in one line unless
# --no-batch-invariance is given.
#
#   bash tests/vulkan_check.sh            # fetch, build (first time ~20-40 min on 2 cores), check
#   bash tests/vulkan_check.sh --fetch    # only fetch and unpack the Vulkan packages
#
# Needs Debian's apt-get and network access. Nothing is installed on the system and nothing
# under /etc or /usr is written: the Vulkan loader, lavapipe, glslc and the headers (and the
# libraries they need that the system lacks) are downloaded with apt-get into a private state
# folder and unpacked with dpkg -x into a private prefix, .venv-vulkan-deps. The system's own
# release gives the binaries; Vulkan-Headers come from Debian 13 (llama.cpp needs
# VK_EXT_layer_settings, 1.3.261+; Debian 12 ships 1.3.239), headers only.
# The tests' slow marker runs it: tests/test_vulkan.py.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv-vulkan
P=$PWD/$V-deps
PKGS=(mesa-vulkan-drivers libvulkan1 libvulkan-dev glslc spirv-headers)
LIB=$P/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)

# apt-get with a private state folder $1 and one sources line $2 (never /etc/apt, /var/lib/apt)
apt_private() {
  local dir=$1 line=$2; shift 2
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/parts"
  printf '%s\n' "$line" > "$dir/sources.list"
  apt-get -o Dir::Etc::SourceList="$dir/sources.list" -o Dir::Etc::SourceParts="$dir/parts" \
          -o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir/cache" -o Debug::NoLocking=1 \
          -o APT::Sandbox::User="$(id -un)" "$@"
}

fetch() {
  local uri suite key=/usr/share/keyrings/debian-archive-keyring.gpg
  uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  uri=${uri:-http://deb.debian.org/debian}
  suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
  local sys="deb [signed-by=$key] $uri $suite main" new="deb [signed-by=$key] $uri trixie main"
  local debs=$P/debs
  mkdir -p "$debs"
  apt_private "$P/apt-system" "$sys" update -qq
  # the packages and every dependency the system does not have installed
  local want
  want=$(apt_private "$P/apt-system" "$sys" -s install --no-install-recommends "${PKGS[@]}" \
         | awk '/^Inst /{print $2}')
  # the loader itself always (libvulkan-dev's libvulkan.so names it relatively)
  want=$(printf '%s\n' $want libvulkan1 | sort -u)
  (cd "$debs" && apt_private "$P/apt-system" "$sys" download -q $want)
  if ! grep -qs LayerSettingEXT /usr/include/vulkan/vulkan_structs.hpp; then
    apt_private "$P/apt-trixie" "$new" update -qq
    (cd "$debs" && rm -f libvulkan-dev_*.deb && apt_private "$P/apt-trixie" "$new" download -q libvulkan-dev)
  fi
  for d in "$debs"/*.deb; do dpkg -x "$d" "$P"; done
  # lavapipe's manifest names its library by its system path: a copy that names the prefix's
  local icd
  icd=$(ls "$P"/usr/share/vulkan/icd.d/lvp_icd*.json | head -1)
  sed "s#\"library_path\": *\"/#\"library_path\": \"$P/#" "$icd" > "$P/lvp_icd.json"
  touch "$P/.fetched"
}

[ -e "$P/.fetched" ] || fetch
[ "${1:-}" = "--fetch" ] && { echo "$P"; exit 0; }
export PATH="$P/usr/bin:$PATH"
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CPATH="$P/usr/include${CPATH:+:$CPATH}"
[ -x $V/bin/python ] || python3 -m venv $V
if ! $V/bin/python -c "import llama_cpp, ngramspec" 2>/dev/null; then
  # --no-cache-dir: never pip's cached CPU wheel of llama-cpp-python
  CMAKE_ARGS="-DGGML_VULKAN=ON -DLLAVA_BUILD=OFF -DVulkan_INCLUDE_DIR=$P/usr/include \
-DVulkan_LIBRARY=$LIB/libvulkan.so -DVulkan_GLSLC_EXECUTABLE=$P/usr/bin/glslc" \
    $V/bin/python -m pip install -q --no-cache-dir -e .
fi
# lavapipe is the only driver the loader is given, so the check is the same on a machine with a
# GPU; ggml's Vulkan backend skips devices of type CPU (lavapipe's) unless they are named
export VK_ICD_FILENAMES=$P/lvp_icd.json
export GGML_VK_VISIBLE_DEVICES=0
exec $V/bin/python tests/vulkan_run.py "$@"
