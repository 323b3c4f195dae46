#include "textflag.h"

// Eight copies of each constant, for use as 256-bit memory operands.
DATA exppoly2<>+0(SB)/4, $0x3c088908
DATA exppoly2<>+4(SB)/4, $0x3c088908
DATA exppoly2<>+8(SB)/4, $0x3c088908
DATA exppoly2<>+12(SB)/4, $0x3c088908
DATA exppoly2<>+16(SB)/4, $0x3c088908
DATA exppoly2<>+20(SB)/4, $0x3c088908
DATA exppoly2<>+24(SB)/4, $0x3c088908
DATA exppoly2<>+28(SB)/4, $0x3c088908
GLOBL exppoly2<>(SB), RODATA|NOPTR, $32

DATA exppoly3<>+0(SB)/4, $0x3d2aa9c1
DATA exppoly3<>+4(SB)/4, $0x3d2aa9c1
DATA exppoly3<>+8(SB)/4, $0x3d2aa9c1
DATA exppoly3<>+12(SB)/4, $0x3d2aa9c1
DATA exppoly3<>+16(SB)/4, $0x3d2aa9c1
DATA exppoly3<>+20(SB)/4, $0x3d2aa9c1
DATA exppoly3<>+24(SB)/4, $0x3d2aa9c1
DATA exppoly3<>+28(SB)/4, $0x3d2aa9c1
GLOBL exppoly3<>(SB), RODATA|NOPTR, $32

DATA exppoly4<>+0(SB)/4, $0x3e2aaaaa
DATA exppoly4<>+4(SB)/4, $0x3e2aaaaa
DATA exppoly4<>+8(SB)/4, $0x3e2aaaaa
DATA exppoly4<>+12(SB)/4, $0x3e2aaaaa
DATA exppoly4<>+16(SB)/4, $0x3e2aaaaa
DATA exppoly4<>+20(SB)/4, $0x3e2aaaaa
DATA exppoly4<>+24(SB)/4, $0x3e2aaaaa
DATA exppoly4<>+28(SB)/4, $0x3e2aaaaa
GLOBL exppoly4<>(SB), RODATA|NOPTR, $32

DATA exppoly5<>+0(SB)/4, $0x3f000000
DATA exppoly5<>+4(SB)/4, $0x3f000000
DATA exppoly5<>+8(SB)/4, $0x3f000000
DATA exppoly5<>+12(SB)/4, $0x3f000000
DATA exppoly5<>+16(SB)/4, $0x3f000000
DATA exppoly5<>+20(SB)/4, $0x3f000000
DATA exppoly5<>+24(SB)/4, $0x3f000000
DATA exppoly5<>+28(SB)/4, $0x3f000000
GLOBL exppoly5<>(SB), RODATA|NOPTR, $32

DATA expone<>+0(SB)/4, $0x3f800000
DATA expone<>+4(SB)/4, $0x3f800000
DATA expone<>+8(SB)/4, $0x3f800000
DATA expone<>+12(SB)/4, $0x3f800000
DATA expone<>+16(SB)/4, $0x3f800000
DATA expone<>+20(SB)/4, $0x3f800000
DATA expone<>+24(SB)/4, $0x3f800000
DATA expone<>+28(SB)/4, $0x3f800000
GLOBL expone<>(SB), RODATA|NOPTR, $32

DATA expbias<>+0(SB)/4, $0x0000007f
DATA expbias<>+4(SB)/4, $0x0000007f
DATA expbias<>+8(SB)/4, $0x0000007f
DATA expbias<>+12(SB)/4, $0x0000007f
DATA expbias<>+16(SB)/4, $0x0000007f
DATA expbias<>+20(SB)/4, $0x0000007f
DATA expbias<>+24(SB)/4, $0x0000007f
DATA expbias<>+28(SB)/4, $0x0000007f
GLOBL expbias<>(SB), RODATA|NOPTR, $32

// func expSumAVX2(dst, src *float32, n int, m float32) float64
//
// dst[i] = e^(src[i]-m) for i < n (n a multiple of 8), for src[i] <= m,
// and returns their sum, taken in float64 over two four-lane accumulators.
// The exponential is exp32's (Cephes' expf) with FMAs: below -87.34 it
// returns the smallest normal float32 rather than 0.
TEXT ·expSumAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS m+24(FP), Y15
	MOVL $0x3fb8aa3b, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14
	MOVL $0x3f000000, AX
	VMOVD AX, X13
	VPBROADCASTD X13, Y13
	MOVL $0xc2aeac4f, AX
	VMOVD AX, X12
	VPBROADCASTD X12, Y12
	MOVL $0x3f318000, AX
	VMOVD AX, X11
	VPBROADCASTD X11, Y11
	MOVL $0xb95e8083, AX
	VMOVD AX, X10
	VPBROADCASTD X10, Y10
	MOVL $0x39506967, AX
	VMOVD AX, X9
	VPBROADCASTD X9, Y9
	MOVL $0x3ab743ce, AX
	VMOVD AX, X8
	VPBROADCASTD X8, Y8
	VXORPD Y6, Y6, Y6
	VXORPD Y7, Y7, Y7

	SHRQ $3, CX
	JEQ  done

loop:
	VMOVUPS      (SI), Y0
	VSUBPS       Y15, Y0, Y0
	VMAXPS       Y12, Y0, Y0
	VMOVAPS      Y0, Y1
	VFMADD213PS  Y13, Y14, Y1
	VROUNDPS     $1, Y1, Y1
	VMOVAPS      Y0, Y2
	VFNMADD231PS Y11, Y1, Y2
	VFNMADD231PS Y10, Y1, Y2
	VMOVAPS      Y9, Y3
	VFMADD213PS  Y8, Y2, Y3
	VFMADD213PS  exppoly2<>(SB), Y2, Y3
	VFMADD213PS  exppoly3<>(SB), Y2, Y3
	VFMADD213PS  exppoly4<>(SB), Y2, Y3
	VFMADD213PS  exppoly5<>(SB), Y2, Y3
	VMULPS       Y2, Y2, Y4
	VFMADD213PS  Y2, Y4, Y3
	VADDPS       expone<>(SB), Y3, Y3
	VCVTTPS2DQ   Y1, Y5
	VPADDD       expbias<>(SB), Y5, Y5
	VPSLLD       $23, Y5, Y5
	VMULPS       Y5, Y3, Y3
	VMOVUPS      Y3, (DI)
	VCVTPS2PD    X3, Y4
	VADDPD       Y4, Y6, Y6
	VEXTRACTF128 $1, Y3, X5
	VCVTPS2PD    X5, Y5
	VADDPD       Y5, Y7, Y7
	ADDQ         $32, SI
	ADDQ         $32, DI
	DECQ         CX
	JNE          loop

done:
	VADDPD       Y7, Y6, Y6
	VEXTRACTF128 $1, Y6, X7
	VADDPD       X7, X6, X6
	VHADDPD      X6, X6, X6
	VZEROUPPER
	MOVSD        X6, ret+32(FP)
	RET
