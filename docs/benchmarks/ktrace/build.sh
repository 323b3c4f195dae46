# Builds ktrace.so (./README.md) against the CUPTI found on this host and
# prints what it used.
set -u
D=$(dirname "$0")
inc=$(dirname "$(find /usr/local/cuda/ /usr/local/cuda/extras /usr/lib/python3*/ /usr/local/lib/python3*/ -name cupti.h 2>/dev/null | head -1)")
lib=$(find /usr/local/cuda/ /usr/local/lib/python3*/ /usr/lib/python3*/ -name 'libcupti.so*' 2>/dev/null | head -1)
echo "cupti.h in $inc; lib $lib"
rec=$(grep -ho 'CUpti_ActivityKernel[0-9]*;' $inc/cupti_activity.h 2>/dev/null | tr -d ';' | sort -V | tail -1)
echo "kernel record: $rec"
ms=$(grep -ho 'CUpti_ActivityMemset[0-9]*;' $inc/cupti_activity.h 2>/dev/null | tr -d ';' | sort -V | tail -1)
mc=$(grep -ho 'CUpti_ActivityMemcpy[0-9]*;' $inc/cupti_activity.h 2>/dev/null | tr -d ';' | sort -V | tail -1)
echo "memset record: $ms, memcpy record: $mc"
cc=$(command -v gcc || command -v cc || command -v clang)
echo "compiler: $cc"
build() {
	$cc -O2 -shared -fPIC -DKREC=$rec "$@" -I$inc -I/usr/local/cuda/include -I/usr/local/cuda/targets/x86_64-linux/include $D/ktrace.c \
		-o /tmp/ktrace.so $lib -Wl,-rpath,$(dirname $lib) -lpthread
}
# With memsets and copies where the header's records allow; kernels alone
# otherwise.
if [ -n "$ms" ] && [ -n "$mc" ] && build -DMSREC=$ms -DMCREC=$mc; then
	echo "built /tmp/ktrace.so (kernels, memsets, copies)"
elif build; then
	echo "built /tmp/ktrace.so (kernels only)"
fi
