-- Requests per client and status code at the gateway (docs/metrics.md), served as Prometheus text.
--
-- HAProxy 2.6 runs no Lua action in `http-after-response`, the only rule set that also sees its own
-- answers (the 401 for a bad key, the 404 for a path, a 503 with no rig up); it does evaluate
-- sample fetches there. So the count is a fetch, called by
--     http-after-response set-var(txn.usage_counted) lua.gemma_usage_count
-- and GET /usage on the loopback metrics frontend is the service `lua.gemma_usage`.
--
-- Loaded with `lua-load` (not lua-load-per-thread): one Lua state for every thread, which HAProxy
-- runs under its global Lua lock, so one table holds every thread's counts and an increment is
-- never lost. The table's keys are bounded: client names come from api-keys.map (inventory names,
-- checked by the role), "-" for a request without a known key, and a 3-digit status (a rig's odd
-- status included: at most 900 codes per client).

local counts = {}  -- "client\0code" -> count

local function escape(value)
    -- Prometheus text format: backslash, double quote and newline are escaped in label values.
    return (value:gsub("\\", "\\\\"):gsub("\"", "\\\""):gsub("\n", "\\n"))
end

core.register_fetches("gemma_usage_count", function(txn)
    local client = txn:get_var("txn.client")
    if client == nil or client == "" then
        client = "-"
    end
    local status = tonumber(txn.sf:status()) or 0
    local code = (status >= 100 and status <= 999) and string.format("%d", status) or "000"
    local key = client .. "\0" .. code
    counts[key] = (counts[key] or 0) + 1
    return "1"
end)

core.register_service("gemma_usage", "http", function(applet)
    local order = {}
    for key in pairs(counts) do
        order[#order + 1] = key
    end
    table.sort(order)
    local lines = {
        "# HELP gemma_gateway_client_requests_total Responses the gateway sent, by client name and status code.",
        "# TYPE gemma_gateway_client_requests_total counter",
    }
    for _, key in ipairs(order) do
        local client, code = key:match("^(.*)%z(%d+)$")
        lines[#lines + 1] = string.format(
            "gemma_gateway_client_requests_total{client=\"%s\",code=\"%s\"} %d",
            escape(client), code, counts[key])
    end
    local body = table.concat(lines, "\n") .. "\n"
    applet:set_status(200)
    applet:add_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
    applet:add_header("content-length", string.len(body))
    applet:start_response()
    applet:send(body)
end)
