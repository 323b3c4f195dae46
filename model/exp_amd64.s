#include "textflag.h"

// CONST8 lays down eight copies of a 32-bit constant, for use as a
// 256-bit memory operand.
#define CONST8(name, v) \
	DATA name<>+0(SB)/4, $v \
	DATA name<>+4(SB)/4, $v \
	DATA name<>+8(SB)/4, $v \
	DATA name<>+12(SB)/4, $v \
	DATA name<>+16(SB)/4, $v \
	DATA name<>+20(SB)/4, $v \
	DATA name<>+24(SB)/4, $v \
	DATA name<>+28(SB)/4, $v \
	GLOBL name<>(SB), RODATA|NOPTR, $32

CONST8(exppoly2, 0x3c088908)
CONST8(exppoly3, 0x3d2aa9c1)
CONST8(exppoly4, 0x3e2aaaaa)
CONST8(exppoly5, 0x3f000000)
CONST8(expone, 0x3f800000)
CONST8(expbias, 0x0000007f)

// BROADCAST puts a 32-bit constant in every lane of a Y register (x is
// its X half).
#define BROADCAST(v, x, y) \
	MOVL $v, AX \
	VMOVD AX, x \
	VPBROADCASTD x, y

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
	BROADCAST(0x3fb8aa3b, X14, Y14) // log2(e)
	BROADCAST(0x3f000000, X13, Y13) // 0.5
	BROADCAST(0xc2aeac4f, X12, Y12) // -87.3365, the smallest argument
	BROADCAST(0x3f318000, X11, Y11) // ln 2, high part
	BROADCAST(0xb95e8083, X10, Y10) // ln 2, low part
	BROADCAST(0x39506967, X9, Y9)   // polynomial
	BROADCAST(0x3ab743ce, X8, Y8)
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
