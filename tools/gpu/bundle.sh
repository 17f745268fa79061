#!/bin/bash
# Packs the GPU binaries (built here by nvcc through `bazel build`) with the MPICH/UCX runtime they link into one
# tarball, for a GPU machine that has the NVIDIA driver and the CUDA, cuBLAS, cuDNN and NCCL libraries but no
# Bazel and no MPICH (how the H100 results in bench/RESULTS.md were taken). There:
#   mkdir ddp_gpu && tar xJf ddp_gpu.tar.xz -C ddp_gpu && ddp_gpu/run.sh [FASHION_MNIST_DIR]
# The CUDA libraries are not packed: run.sh finds that machine's own (toolkit, driver, pip wheels). The host
# benchmarks of issue 13 come along; host_bench.sh runs them on that machine's CPUs (a second, larger host), and
# cluster_bench.sh runs the cost model across namespace hosts there (tools/cluster, with this machine's ip and tc,
# which such machines lack).
# usage: tools/gpu/bundle.sh [OUT.tar.xz]      (default bazel-bin/ddp_gpu.tar.xz; from the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."
out="$(realpath -m "${1:-bazel-bin/ddp_gpu.tar.xz}")"
targets=(//test/tensor:device_cuda_tests //test/comm:nccl_conformance
         //test/parallel:ddp_nccl_main //examples:fashion_mnist_cuda
         //bench/comm:allreduce //bench/comm:core_pingpong //bench:ddp_step //bench:cost_model)
bazel build "${targets[@]}"
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
bins=(/usr/bin/mpiexec.hydra /usr/bin/hydra_pmi_proxy)
for t in "${targets[@]}"; do
  p="${t#//}"; bins+=("bazel-bin/${p%%:*}/${p#*:}")
done
cp -L "${bins[@]}" "$stage/bin/"
# Every shared library they need (ldd where they were built: their RUNPATHs are relative) except the C/C++
# runtime (the GPU machine has its own, newer) and CUDA's.
skip='^(libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s|ld-linux.*|libcuda|libcudart|libcublas.*|libcudnn.*|libnccl|libnvrtc.*)\.so'
for f in "${bins[@]}"; do ldd "$f"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ "$name" =~ $skip ]] || cp -L "$path" "$stage/lib/$name"
  done
for f in "$stage"/lib/*; do ldd "$f"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ "$name" =~ $skip || -e "$stage/lib/$name" ]] || cp -L "$path" "$stage/lib/$name"
  done
ln -s mpiexec.hydra "$stage/bin/mpiexec"  # tools/cluster/mpiexec.sh runs `mpiexec`
# iproute2 for tools/cluster: each tool run by the dynamic loader with its own libraries (--library-path), so
# the commands `ip netns exec` starts do not inherit them.
mkdir -p "$stage/net/bin" "$stage/net/lib" "$stage/cluster"
for t in ip tc; do
  p=$(command -v "$t" || echo "/usr/sbin/$t")
  [ -x "$p" ] || { echo "bundle.sh: $t (iproute2) is not installed here: run tools/setup.sh" >&2; exit 1; }
  cp -L "$p" "$stage/net/$t.bin"
  ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ ^(libc|libm|libdl|libpthread)\.so ]] || cp -L "$path" "$stage/net/lib/$name"
  done
  printf '#!/bin/sh\nd="$(cd "$(dirname "$0")/.." && pwd)"\nexec /lib64/ld-linux-x86-64.so.2 --library-path "$d/lib" "$d/%s.bin" "$@"\n' \
    "$t" > "$stage/net/bin/$t"
  chmod +x "$stage/net/bin/$t"
done
cp tools/cluster/cluster.sh tools/cluster/mpiexec.sh tools/cluster/ns_rsh.sh "$stage/cluster/"
cp tools/gpu/run.sh tools/gpu/host_bench.sh tools/gpu/cluster_bench.sh tools/gpu/step.sh bench/gpu/torch_step.py "$stage/"
chmod -R u+w "$stage"
tar -C "$stage" -cJf "$out" bin lib net cluster run.sh host_bench.sh cluster_bench.sh step.sh
echo "wrote $out ($(du -h "$out" | cut -f1)): $(ls "$stage/bin" | tr '\n' ' ')"
