/**
 * A soak work-lease worker (property 7): placeholder until WorkLeaseSql has lease timeouts.
 */
process.stderr.write("work leases are not in this build\n")
process.exit(1)
