#!/usr/bin/env bash
# Builds llama-cpp-python with llama.cpp's Vulkan backend into .venv-vulkan (beside .venv) and
# runs ngramspec on it: a non-CPU device, here Mesa's software Vulkan driver (lavapipe), so the
# check runs on any machine. Shows what ngramspec does with a GPU build (docs/exactness.md,
# "Builds with a GPU backend"): its kernels turned off with a reason, -ngl 0 runs everything on
# the CPU with spec-on output equal to spec-off, -ngl 99 is refused in one line unless
# --no-batch-invariance is given.
#
#   bash tests/vulkan_check.sh            # build (first time ~20-40 min on 2 cores), then check
#
# Needs Debian's mesa-vulkan-drivers, libvulkan-dev, glslc and spirv-headers (installed here when missing and
# apt-get is there). The tests' slow marker runs it: tests/test_vulkan.py.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v glslc >/dev/null || [ ! -e /usr/include/vulkan/vulkan.h ] || [ ! -d /usr/include/spirv ] \
   || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq mesa-vulkan-drivers libvulkan-dev glslc spirv-headers >/dev/null
fi
V=.venv-vulkan
INC=
if ! grep -qs LayerSettingEXT /usr/include/vulkan/vulkan_structs.hpp; then
  # llama.cpp's Vulkan backend needs Vulkan-Headers with VK_EXT_layer_settings (1.3.261+);
  # Debian 12 ships 1.3.239: unpack Debian 13's libvulkan-dev beside the venv, headers only
  # (the Vulkan loader stays the system's), from the same Debian mirror apt is set up with
  H=$PWD/$V-headers
  if [ ! -d "$H/usr/include/vulkan" ]; then
    URI=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
    printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$URI" > /etc/apt/sources.list.d/ngramspec-vulkan-headers.sources
    apt-get update -qq
    D=$(mktemp -d)
    (cd "$D" && apt-get download -q -t trixie libvulkan-dev) || true
    rm -f /etc/apt/sources.list.d/ngramspec-vulkan-headers.sources
    apt-get update -qq
    dpkg -x "$D"/libvulkan-dev_*.deb "$H"
    rm -rf "$D"
  fi
  INC="-DVulkan_INCLUDE_DIR=$H/usr/include"
fi
[ -x $V/bin/python ] || python3 -m venv $V
if ! $V/bin/python -c "import llama_cpp, ngramspec" 2>/dev/null; then
  # --no-cache-dir: never pip's cached CPU wheel of llama-cpp-python
  CMAKE_ARGS="-DGGML_VULKAN=ON -DLLAVA_BUILD=OFF $INC" $V/bin/python -m pip install -q --no-cache-dir -e .
fi
# lavapipe is the only driver the loader is given, so the check is the same on a machine with a
# GPU; ggml's Vulkan backend skips devices of type CPU (lavapipe's) unless they are named
export VK_ICD_FILENAMES=$(ls /usr/share/vulkan/icd.d/lvp_icd*.json | head -1)
export GGML_VK_VISIBLE_DEVICES=0
exec $V/bin/python tests/vulkan_run.py "$@"
