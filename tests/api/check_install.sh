#!/bin/sh
# Installs the built tree into a temporary prefix, then uses it as a user
# would, with LLMT_LIBRARY and LD_LIBRARY_PATH unset:
# - a C consumer through find_package(llmt COMPONENTS static) (shared and
#   static) and through pkg-config, which is shown no module but llmt's;
# - the static library linked against a oneDNN the linker would not find by
#   name (LLMT_ONEDNN_LIBRARY pointing elsewhere): linked by that path;
# - a C++-only consumer (C not enabled) through find_package(llmt), with
#   pkg-config made blind, so the shared library's package needs neither
#   OpenMP for C nor its dependencies' development files;
# - from a copy of the prefix moved elsewhere (so nothing can reach back into
#   the build tree): the tools' --help, and `import llmt` through the
#   installed Python package, and through pkg-config from a source copy.
# Usage: check_install.sh BUILD_DIR API_TEST_DIR [PYTHON]
#   API_TEST_DIR holds consumer/ and consumer_cxx/; without PYTHON the Python
#   checks are not run (and the script says so).
set -eu
build_dir=$1
api_dir=$2
python=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset LLMT_LIBRARY LD_LIBRARY_PATH
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

cmake --install "$build_dir" --prefix "$tmp/prefix" > "$tmp/install.log"
pcdir=$(dirname "$(find "$tmp/prefix" -name llmt.pc)")
libdir=$(dirname "$pcdir")

# OpenBLAS is the benchmarks' reference only: the library does not load it.
if readelf -d "$libdir/libllmt.so.0" | grep -i "NEEDED.*openblas"; then
    fail "libllmt.so.0 needs OpenBLAS, which it does not use"
fi

consumer=$api_dir/consumer
cmake -S "$consumer" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/cfg.log"
cmake --build "$tmp/cmake-build" > "$tmp/build.log"
"$tmp/cmake-build/consumer_shared"
"$tmp/cmake-build/consumer_static"

# oneDNN elsewhere: a link to the build's libdnnl in a directory of its own.
onednn=$(sed -n 's/^LLMT_ONEDNN_LIBRARY:FILEPATH=//p' "$build_dir/CMakeCache.txt")
[ -f "$onednn" ] || fail "no LLMT_ONEDNN_LIBRARY in $build_dir/CMakeCache.txt"
mkdir "$tmp/onednn"
ln -s "$(realpath "$onednn")" "$tmp/onednn/libdnnl.so"
cmake -S "$consumer" -B "$tmp/onednn-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    -DLLMT_ONEDNN_LIBRARY="$tmp/onednn/libdnnl.so" > "$tmp/onednn-cfg.log"
cmake --build "$tmp/onednn-build" --target consumer_static > "$tmp/onednn-build.log"
grep -q -- "$tmp/onednn/libdnnl.so" "$tmp/onednn-build/CMakeFiles/consumer_static.dir/link.txt" ||
    fail "llmt::llmt_static links oneDNN by name, not LLMT_ONEDNN_LIBRARY's path:" \
        "$(cat "$tmp/onednn-build/CMakeFiles/consumer_static.dir/link.txt")"
"$tmp/onednn-build/consumer_static"

mkdir "$tmp/no-pc"
if ! env -u PKG_CONFIG_PATH PKG_CONFIG_LIBDIR="$tmp/no-pc" cmake -S "$api_dir/consumer_cxx" \
        -B "$tmp/cxx-build" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/cxx-cfg.log" 2>&1 ||
   ! cmake --build "$tmp/cxx-build" > "$tmp/cxx-build.log" 2>&1; then
    cat "$tmp/cxx-cfg.log" "$tmp/cxx-build.log" 2>/dev/null >&2
    fail "a C++-only project cannot use find_package(llmt) without pkg-config"
fi
"$tmp/cxx-build/consumer_cxx"

# pkg-config sees only llmt.pc: the shared library needs no other module,
# and the static one's dependencies are flags in llmt.pc itself.
flags=$(PKG_CONFIG_LIBDIR="$pcdir" pkg-config --cflags --libs llmt) ||
    fail "pkg-config --libs llmt needs modules other than llmt"
cc -o "$tmp/consumer_pc" "$consumer/consumer.c" $flags
LD_LIBRARY_PATH="$libdir" "$tmp/consumer_pc"
static_libs=$(PKG_CONFIG_LIBDIR="$pcdir" pkg-config --static --libs llmt)
case " $static_libs " in
*" -ldnnl "*) ;;
*) fail "pkg-config --static --libs llmt does not name oneDNN: $static_libs" ;;
esac
case " $static_libs " in
*openblas*) fail "pkg-config --static --libs llmt names OpenBLAS, which libllmt does not use" ;;
esac

# A moved copy of the prefix: the tools run from it and load its libllmt.
cp -a "$tmp/prefix" "$tmp/moved"
moved_libdir=$tmp/moved${libdir#"$tmp/prefix"}
for tool in llmt-train llmt-plan llmt-tokenize llmt-generate llmt-eval llmt-ckpt; do
    exe=$tmp/moved/bin/$tool
    [ -x "$exe" ] || fail "cmake --install did not install bin/$tool"
    "$exe" --help > "$tmp/help.out" 2>&1 || fail "installed $tool --help: $(cat "$tmp/help.out")"
    grep -q "usage" "$tmp/help.out" || fail "installed $tool --help printed no usage"
    loaded=$(realpath "$(ldd "$exe" | awk '$1 == "libllmt.so.0" {print $3}')")
    [ "$loaded" = "$(realpath "$moved_libdir/libllmt.so.0")" ] ||
        fail "installed $tool loads libllmt from '$loaded', not $moved_libdir"
done

if [ -z "$python" ]; then
    echo "ok: installed package consumed through CMake (C shared and static, C++ without"
    echo "    pkg-config) and pkg-config; installed tools run; Python NOT checked (no python3)"
    exit 0
fi
where_llmt='import llmt, os; print(os.path.realpath(llmt.library_path))'
site=$(find "$tmp/moved" -type d -name site-packages)
[ -f "$site/llmt/_lib.py" ] || fail "cmake --install did not install the Python package"
loaded=$(cd "$tmp" && PYTHONPATH="$site" "$python" -c "$where_llmt")
[ "$loaded" = "$(realpath "$moved_libdir/libllmt.so.0")" ] ||
    fail "the installed Python package loads '$loaded', not the prefix's library"
mkdir "$tmp/pysrc"
cp -r "$api_dir/../../bindings/python/llmt" "$tmp/pysrc/"
rm -f "$tmp/pysrc/llmt/libllmt.so"*
loaded=$(cd "$tmp" && PYTHONPATH="$tmp/pysrc" PKG_CONFIG_PATH="$tmp/moved/${pcdir#"$tmp/prefix/"}" \
         "$python" -c "$where_llmt")
[ "$loaded" = "$(realpath "$moved_libdir/libllmt.so.0")" ] ||
    fail "the Python package loads '$loaded', not the library pkg-config names"
echo "ok: installed package consumed through CMake (C shared and static, C++ without"
echo "    pkg-config) and pkg-config; installed tools and Python package run from the prefix"
