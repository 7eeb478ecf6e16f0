"""The doctor's Ascend network checks: every NPU NIC up and healthy, and addressed by one subnet plan.

HCCL talks between nodes over each NPU's own RoCE NIC, configured with hccn_tool (``/etc/hccn.conf``
``address_N``/``netmask_N``); a NIC that is down or unaddressed makes the job hang at its first collective,
far from the cause. ``hccn_tool -i N -link -g``, ``-net_health -g`` and ``-ip -g`` are asked for every chip
that ``npu-smi info -m`` lists (N = its logical ID, as the exporter's sweep does).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable

from npudist.doctor.checks import check
from npudist.doctor.host import Host
from npudist.doctor.result import FAIL, OK, SKIP, WARN, CheckResult
from npudist.telemetry.sources.ascend_sweep import HCCN_TOOL_DRIVER_PATH
from npudist.telemetry.sources.hccn.parse import parse_ip, parse_link, parse_net_health
from npudist.telemetry.sources.measurements import Measurement
from npudist.telemetry.sources.npu_smi.mapping import parse_mapping

NAME, IP_NAME = "ascend-nics", "ascend-nic-ips"


def _hccn_tool(host: Host) -> str | None:
    found = host.which("hccn_tool")
    if found:
        return found
    return HCCN_TOOL_DRIVER_PATH if host.path(HCCN_TOOL_DRIVER_PATH).exists() else None


def _ask(host: Host, exe: str, nic: int, query: str, parse: Callable[[str], list[Measurement]]
         ) -> list[Measurement] | str:
    """The parsed answer, or a short reason why there is none."""
    try:
        return parse(host.run([exe, "-i", str(nic), f"-{query}", "-g"], host.tool_timeout))
    except Exception as exc:  # a hung, failing or garbage-printing tool is a finding, not a crash
        return f"`hccn_tool -i {nic} -{query} -g` unusable: {str(exc)[:120]}"


@check(NAME)
def ascend_nics(host: Host) -> list[CheckResult]:
    npu_smi, hccn = host.which("npu-smi"), _hccn_tool(host)
    if not npu_smi or not hccn:
        return [CheckResult(NAME, SKIP, "not an Ascend host with RoCE NICs (npu-smi or hccn_tool not found)")]
    try:
        chips = parse_mapping(host.run([npu_smi, "info", "-m"], host.tool_timeout))
    except Exception as exc:
        return [CheckResult(NAME, WARN, f"cannot list the chips (`npu-smi info -m`): {str(exc)[:160]}",
                            "run `npu-smi info -m` by hand")]
    problems: list[str] = []
    addresses: dict[int, tuple[ipaddress.IPv4Interface, str]] = {}
    unaddressed: list[str] = []
    for (npu, chip), nic in sorted(chips.items(), key=lambda kv: kv[1]):
        link = _ask(host, hccn, nic, "link", parse_link)
        health = _ask(host, hccn, nic, "net_health", parse_net_health)
        ip = _ask(host, hccn, nic, "ip", parse_ip)
        if isinstance(ip, list):
            labels = dict(ip[0].labels)
            where = f"NIC {nic} (NPU {npu} chip {chip}, {labels['address']})"
            addresses[nic] = (ipaddress.IPv4Interface(f"{labels['address']}/{labels['netmask']}"), where)
        else:
            where = f"NIC {nic} (NPU {npu} chip {chip})"
            unaddressed.append(f"{where}: {ip}")
        if isinstance(link, str):
            problems.append(f"{where}: {link}")
        elif link[0].value == 0:
            problems.append(f"{where}: link DOWN")
        if isinstance(health, str):
            problems.append(f"{where}: {health}")
        elif health[0].value == 0:
            status = dict(health[1].labels)["status"]
            problems.append(f"{where}: net health {status}")
    out = [CheckResult(NAME, FAIL, "; ".join(problems),
                       "check the cable, optic and switch port of each NIC named (`hccn_tool -i N -optical -g`), "
                       "and the detect address in /etc/hccn.conf (`hccn_tool -i N -netdetect -g`)")
           if problems else
           CheckResult(NAME, OK, f"{len(chips)} NPU NIC(s) link up, net health success")]
    out.append(_subnet_plan(addresses, unaddressed))
    return out


def _subnet_plan(addresses: dict[int, tuple[ipaddress.IPv4Interface, str]], unaddressed: list[str]) -> CheckResult:
    """Every NIC addressed, with one netmask and distinct addresses, and either one shared subnet or one subnet
    per NIC (one per switch plane): a mix means a mistyped address_N in /etc/hccn.conf."""
    fix = "set address_N/netmask_N in /etc/hccn.conf (hccn_tool -i N -ip -s address A netmask M) by the node's plan"
    if unaddressed:
        return CheckResult(IP_NAME, FAIL, "; ".join(unaddressed), fix)
    if not addresses:
        return CheckResult(IP_NAME, SKIP, "no NIC listed")
    masks = Counter(str(iface.netmask) for iface, _ in addresses.values())
    usual_mask = masks.most_common(1)[0][0]
    odd = [f"{where} has netmask {iface.netmask}, its peers {usual_mask}"
           for iface, where in addresses.values() if str(iface.netmask) != usual_mask]
    seen = Counter(iface.ip for iface, _ in addresses.values())
    odd += [f"{where} shares its address with another NIC" for iface, where in addresses.values() if seen[iface.ip] > 1]
    networks = Counter(iface.network for iface, _ in addresses.values())
    if not odd and 1 < len(networks) < len(addresses):
        alone = sum(n == 1 for n in networks.values())
        if alone * 2 > len(addresses):  # most NICs have a subnet of their own: the plan is one per NIC
            odd += [f"{where} shares subnet {iface.network} with another NIC, while the others each have "
                    "their own" for iface, where in addresses.values() if networks[iface.network] > 1]
        else:
            shared = networks.most_common(1)[0][0]
            odd += [f"{where} is in {iface.network}, while its peers share {shared}"
                    for iface, where in addresses.values() if iface.network != shared]
    if odd:
        return CheckResult(IP_NAME, FAIL, "; ".join(odd), fix)
    plan = "one shared subnet" if len(networks) == 1 else "one subnet per NIC"
    return CheckResult(IP_NAME, OK, f"{len(addresses)} NIC address(es), {plan}, netmask {usual_mask}")
