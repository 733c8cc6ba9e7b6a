package fidelity

// modules are the regression test modules both sides run: what agents'
// projects lean on (files, processes, signals, terminals, sockets, HTTP,
// TLS, threads and processes, time and locale, the interpreter's view of
// its machine, archives). regrtest hands them to its workers in this
// order, so the slowest come first and the rest fill in beside them (the
// side's time is then about its slowest module's, not the sum's tail).
// Measured on this 2-core machine at -j2 in the chroot, idle; dropped,
// with the reason:
//
//   - test_multiprocessing_spawn: 1 min 18 s and CPU-bound (every child
//     imports the test suite afresh); the fork variant is kept.
//   - test_socketserver: skipped without -u network on both sides.
//   - test_sqlite3: not in Debian's testsuite package.
var modules = []string{
	// The slowest first (wall time at -j4, both sides at once):
	// concurrent_futures ~135 s, asyncio 80-125, multiprocessing_fork
	// 70-90, signal ~50, the next six 25-40.
	"test_concurrent_futures", "test_asyncio", "test_multiprocessing_fork", "test_signal",
	"test_ssl", "test_io", "test_imaplib", "test_subprocess", "test_xmlrpc", "test_socket",
	// Files and directories.
	"test_os", "test_posix", "test_stat", "test_shutil", "test_tempfile", "test_pathlib", "test_glob",
	"test_fileinput", "test_fileio", "test_genericpath", "test_posixpath", "test_largefile",
	"test_unicode_file_functions",
	// Processes, signals, terminals, polling.
	"test_pty", "test_openpty", "test_select", "test_selectors",
	"test_poll", "test_epoll", "test_fcntl", "test_resource", "test_mmap", "test_wait3", "test_wait4",
	"test_threadsignals", "test_eintr", "test_faulthandler",
	// Networking on loopback, HTTP, mail and TLS protocols.
	"test_httpservers", "test_http_cookiejar", "test_httplib", "test_urllib2_localnet",
	"test_urllib", "test_urllib2", "test_logging", "test_ftplib", "test_smtplib",
	"test_poplib", "test_wsgiref",
	// Threads and processes.
	"test_threading", "test_queue",
	// Time, locale.
	"test_time", "test_datetime", "test_zoneinfo", "test_locale", "test_calendar",
	"test_c_locale_coercion", "test_utf8_mode",
	// The interpreter and its machine: users, groups, paths, platform.
	"test_sys", "test_sysconfig", "test_site", "test_platform", "test_getpass", "test_pwd", "test_grp",
	"test_uuid", "test_cmd_line", "test_cmd_line_script", "test_embed", "test_tracemalloc",
	"test_support", "test_compileall", "test_py_compile", "test_importlib", "test_zipimport", "test_pkgutil",
	// Data and archives.
	"test_hashlib", "test_json", "test_zipfile", "test_tarfile", "test_gzip", "test_zlib", "test_bz2",
	"test_lzma", "test_dbm", "test_mailbox", "test_netrc", "test_shlex", "test_sched",
	// What the image lacks (a compiler, headers, ensurepip): these fail
	// on both sides and show that the comparison sees failures.
	"test_venv", "test_ensurepip",
}
