#!/bin/sh
# Neovim 0.12 for `pytest -m nvim12`: a Debian sid chroot made with debootstrap (slow: a few
# minutes, needs root and network), and a wrapper that runs its nvim on the host with the
# chroot's own loader and libraries (so the plugin can start the host's dlm-lsp).
#   sh tests/editors/make_nvim12.sh /work/nvim12-chroot
#   DLM_NVIM12=/work/nvim12-chroot/nvim12 pytest -m nvim12 tests/editors/test_nvim.py
set -eu
C=$(realpath -m "${1:?usage: make_nvim12.sh CHROOT_DIR (outside the repo or gitignored)}")
if [ ! -x "$C/usr/bin/nvim" ]; then
    command -v debootstrap >/dev/null || { echo "install debootstrap (apt-get install debootstrap)" >&2; exit 1; }
    debootstrap --variant=minbase --include=neovim sid "$C" http://deb.debian.org/debian
fi
cat > "$C/nvim12" <<WRAP
#!/bin/sh
exec env VIMRUNTIME=$C/usr/share/nvim/runtime $C/lib64/ld-linux-x86-64.so.2 \
  --library-path $C/usr/lib/x86_64-linux-gnu:$C/lib/x86_64-linux-gnu $C/usr/bin/nvim "\$@"
WRAP
chmod +x "$C/nvim12"
"$C/nvim12" --version | head -1
