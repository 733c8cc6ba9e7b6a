package seccomp

const auditArchAarch64 = 0xc00000b7 // AUDIT_ARCH_AARCH64

func init() {
	// arm64 has only the generic calls, all in the common lists.
	arches["arm64"] = arch{audit: auditArchAarch64}
}
