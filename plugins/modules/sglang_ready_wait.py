#!/usr/bin/python
# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_ready_wait
short_description: Wait until every SGLang worker is ready and the sglang-router routes to all of them
version_added: 1.1.0
author:
  - gpuops.repurpose maintainers (@gpuops)
description:
  - Polls every worker's own C(/health_generate) (SGLang answers 503 while the server starts, 200 once a
    one-token generation came back) and, with O(router), the router's worker list (C(GET /workers)), until
    every worker is ready and listed healthy by the router, or O(timeout) seconds.
  - The router's own C(/health_generate) is not enough. sglang-router 0.3.2 answers it 200 as soon as one
    worker is registered, and drops a worker that was not healthy within its C(--worker-startup-timeout-secs)
    for good while it stays up. So a ready worker the router does not list is registered with it
    (C(POST /workers)); the same URL twice is one worker.
  - Fails when a worker is not ready in time, naming it; the result still holds every worker's state.
requirements:
  - Network access from the target to the workers and the router.
options:
  workers:
    description: The workers' base URLs (C(http://HOST:PORT)); a trailing slash is ignored.
    type: list
    elements: str
    required: true
  router:
    description: The sglang-router's base URL, whose worker list must hold every worker. Without it only the
      workers are asked.
    type: str
  timeout:
    description: Seconds to wait in all (>= 0; 0 asks once).
    type: float
    required: true
  delay:
    description: Seconds between rounds (> 0).
    type: float
    default: 5
  api_key_file:
    description:
      - A file on the target holding the API key the workers and the router take (C(NAME=KEY), as the role's
        C(api-key.env), or the key alone). It is sent as a bearer token on every request.
      - The key is read on the target; it is never an option's value, so it is in no log and no argv.
    type: path
extends_documentation_fragment:
  - gpuops.repurpose.attributes
  - gpuops.repurpose.attributes.PLATFORM
attributes:
  check_mode:
    support: partial
    details: Polls as usual but registers no worker with the router; RV(would_register) names those it would.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: Changes something only when the router had dropped a ready worker; a second run finds it listed.
  platform:
    support: full
    platforms: posix
seealso:
  - module: gpuops.repurpose.sglang_units_info
notes:
  - The role C(gpuops.repurpose.sglang_datagen) runs it as its readiness gate before it launches the pipeline.
"""

EXAMPLES = r"""
- name: Wait until both workers are ready and the router routes to them (30 minutes at most)
  gpuops.repurpose.sglang_ready_wait:
    workers:
      - http://gpu1.example.internal:31000
      - http://gpu1.example.internal:31001
    router: http://gpu1.example.internal:30000
    timeout: 1800
    delay: 5
    api_key_file: /opt/datagen/api-key.env
  register: gate
  failed_when: false

- name: Say which workers are not ready
  ansible.builtin.debug:
    msg: "{{ gate.stuck | map('extract', gate.workers) | list }}"
  when: not gate.ready
"""

RETURN = r"""
ready:
  description: Whether every worker is ready and, with O(router), listed healthy by the router.
  returned: always
  type: bool
elapsed:
  description: Seconds the gate took.
  returned: always
  type: float
  sample: 42.5
workers:
  description: Each worker's last state, C(ready) or why not (C(HTTP 503), C(no answer) and the reason).
  returned: always
  type: dict
  sample: {"http://gpu1.example.internal:31000": ready, "http://gpu1.example.internal:31001": HTTP 503}
not_ready:
  description: The workers whose own C(/health_generate) did not answer 200.
  returned: always
  type: list
  elements: str
stuck:
  description: Every worker that keeps the gate closed (not ready, not listed by the router, or listed unhealthy),
    each once, in the order of O(workers).
  returned: always
  type: list
  elements: str
router:
  description: The router asked (null without O(router)).
  returned: always
  type: str
router_answered:
  description: Whether the router answered C(GET /workers) (null without O(router)).
  returned: always
  type: bool
router_missing:
  description: The workers the router does not list.
  returned: always
  type: list
  elements: str
router_unhealthy:
  description: The workers the router lists unhealthy.
  returned: always
  type: list
  elements: str
registered:
  description: The workers registered with the router by this run.
  returned: always
  type: list
  elements: str
would_register:
  description: In check mode, the ready workers the router does not list, which a real run would register.
  returned: always
  type: list
  elements: str
msg:
  description: How many workers are not ready, naming them.
  returned: when not ready
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.repurpose.plugins.module_utils._datagen.ready import wait_ready
from ansible_collections.gpuops.repurpose.plugins.module_utils._exit import exit_module


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            workers=dict(type="list", elements="str", required=True),
            router=dict(type="str"),
            timeout=dict(type="float", required=True),
            delay=dict(type="float", default=5),
            api_key_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    exit_module(module, wait_ready(module.params, check_mode=module.check_mode))


if __name__ == "__main__":
    main()
