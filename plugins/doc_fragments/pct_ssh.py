# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This doc fragment is PRIVATE to gpuops.repurpose; it may change at any time.
# The options of the pct_ssh connection (plugins/connection/pct_ssh.py) that are about SSH, not pct:
# DOCUMENTATION logs in to the Proxmox VE host (read by plugin_utils/_pct_ssh/settings.py Settings),
# SESSION bounds and shares that login and says how commands and files travel over it.

from __future__ import annotations


class ModuleDocFragment:

    DOCUMENTATION = r"""
options:
  remote_addr:
    description: Address of the Proxmox VE host that runs the container (not of the container).
    type: string
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: ansible_ssh_host
      - name: ansible_paramiko_host
  port:
    description: SSH port of the Proxmox VE host.
    type: int
    default: 22
    ini:
      - section: defaults
        key: remote_port
      - section: paramiko_connection
        key: remote_port
    env:
      - name: ANSIBLE_REMOTE_PORT
      - name: ANSIBLE_REMOTE_PARAMIKO_PORT
    vars:
      - name: ansible_port
      - name: ansible_ssh_port
      - name: ansible_paramiko_port
    keyword:
      - name: port
  pve_user:
    description:
      - User to log in as on the Proxmox VE host (C(ansible_user), the C(remote_user) keyword, C(-u)).
        Commands inside the container run as the container's root (use C(become) to change user inside
        the container).
      - Any user other than C(root) runs C(pct) through O(proxmox_become_method).
      - "This option is not named C(remote_user) on purpose: Ansible takes a connection's C(remote_user) for the
        user that runs commands on the target and expands C(~), the temporary directory (C(remote_tmp)) and the
        C(async) job directory (C(async_dir)) in that user's home. The target here is the container, where
        commands run as C(root) (or the C(become_user)), and a host login such as C(pveops) does not exist there.
        So C(~) means C(~root) inside the container (C(/root/.ansible/tmp), C(/root/.ansible_async)), whatever
        the host login."
    type: string
    vars:
      - name: ansible_user
      - name: ansible_ssh_user
      - name: ansible_paramiko_user
    env:
      - name: ANSIBLE_REMOTE_USER
      - name: ANSIBLE_PARAMIKO_REMOTE_USER
    ini:
      - section: defaults
        key: remote_user
      - section: paramiko_connection
        key: remote_user
    keyword:
      - name: remote_user
  password:
    description: Password for the SSH login, or the passphrase of O(private_key_file).
    type: string
    vars:
      - name: ansible_password
      - name: ansible_ssh_pass
      - name: ansible_ssh_password
      - name: ansible_paramiko_pass
      - name: ansible_paramiko_password
  private_key_file:
    description: Private key for the SSH login.
    type: string
    ini:
      - section: defaults
        key: private_key_file
      - section: paramiko_connection
        key: private_key_file
    env:
      - name: ANSIBLE_PRIVATE_KEY_FILE
      - name: ANSIBLE_PARAMIKO_PRIVATE_KEY_FILE
    vars:
      - name: ansible_private_key_file
      - name: ansible_ssh_private_key_file
      - name: ansible_paramiko_private_key_file
    cli:
      - name: private_key_file
        option: "--private-key"
  look_for_keys:
    description: Whether to also try the keys in C(~/.ssh/).
    type: boolean
    default: true
    env:
      - name: ANSIBLE_PARAMIKO_LOOK_FOR_KEYS
    ini:
      - section: paramiko_connection
        key: look_for_keys
    vars:
      - name: ansible_pct_ssh_look_for_keys
  host_key_checking:
    description:
      - Whether to check the host key against O(known_hosts_file) and C(/etc/ssh/ssh_known_hosts).
      - With V(true) (the default) an unknown host key is rejected unless O(host_key_auto_add) is set.
      - V(false) accepts any key and records nothing.
    type: boolean
    default: true
    env:
      - name: ANSIBLE_HOST_KEY_CHECKING
      - name: ANSIBLE_SSH_HOST_KEY_CHECKING
      - name: ANSIBLE_PARAMIKO_HOST_KEY_CHECKING
    ini:
      - section: defaults
        key: host_key_checking
      - section: paramiko_connection
        key: host_key_checking
    vars:
      - name: ansible_host_key_checking
      - name: ansible_ssh_host_key_checking
      - name: ansible_paramiko_host_key_checking
  host_key_auto_add:
    description: Accept an unknown host key (trust on first use) and, with O(record_host_keys), record it.
    type: boolean
    default: false
    env:
      - name: ANSIBLE_PARAMIKO_HOST_KEY_AUTO_ADD
    ini:
      - section: paramiko_connection
        key: host_key_auto_add
    vars:
      - name: ansible_pct_ssh_host_key_auto_add
  record_host_keys:
    description: Append host keys accepted through O(host_key_auto_add) to O(known_hosts_file).
    type: boolean
    default: true
    env:
      - name: ANSIBLE_PARAMIKO_RECORD_HOST_KEYS
    ini:
      - section: paramiko_connection
        key: record_host_keys
    vars:
      - name: ansible_pct_ssh_record_host_keys
  known_hosts_file:
    description: The known_hosts file to check host keys against and to record new ones in.
    type: path
    default: ~/.ssh/known_hosts
    env:
      - name: ANSIBLE_PCT_SSH_KNOWN_HOSTS_FILE
    ini:
      - section: pct_ssh_connection
        key: known_hosts_file
    vars:
      - name: ansible_pct_ssh_known_hosts_file
  lock_file_timeout:
    description: Seconds to wait for the lock on O(known_hosts_file) when recording a host key.
    type: int
    default: 60
    env:
      - name: ANSIBLE_LOCK_FILE_TIMEOUT
    vars:
      - name: ansible_lock_file_timeout
  proxy_command:
    description:
      - A command whose stdin/stdout carry the SSH connection (a jump host), for example
        C(ssh -W %h:%p bastion.example.internal). C(%h), C(%p) and C(%r) are replaced by host, port and user.
    type: string
    default: ""
    env:
      - name: ANSIBLE_PARAMIKO_PROXY_COMMAND
    ini:
      - section: paramiko_connection
        key: proxy_command
    vars:
      - name: ansible_paramiko_proxy_command
  use_rsa_sha2_algorithms:
    description: Whether to allow the RSA SHA2 algorithms for keys and host keys (V(false) for very old servers).
    type: boolean
    default: true
    env:
      - name: ANSIBLE_PARAMIKO_USE_RSA_SHA2_ALGORITHMS
    ini:
      - section: paramiko_connection
        key: use_rsa_sha2_algorithms
    vars:
      - name: ansible_paramiko_use_rsa_sha2_algorithms
  timeout:
    description: Seconds to wait for the TCP connection and for the login.
    type: int
    default: 10
    ini:
      - section: defaults
        key: timeout
      - section: paramiko_connection
        key: timeout
    env:
      - name: ANSIBLE_TIMEOUT
      - name: ANSIBLE_PARAMIKO_TIMEOUT
    vars:
      - name: ansible_ssh_timeout
      - name: ansible_paramiko_timeout
    cli:
      - name: timeout
  banner_timeout:
    description: Seconds to wait for the SSH banner.
    type: float
    default: 30
    ini:
      - section: paramiko_connection
        key: banner_timeout
    env:
      - name: ANSIBLE_PARAMIKO_BANNER_TIMEOUT
"""

    SESSION = r"""
options:
  server_alive_interval:
    description:
      - Seconds between keepalive probes to the Proxmox VE host, as OpenSSH's C(ServerAliveInterval). Each probe
        asks the host's sshd for an answer; paramiko's own keepalive (sent at the same interval when the connection
        is idle) keeps NAT and firewall state fresh.
      - A host that leaves a probe unanswered for O(server_alive_interval) x O(server_alive_count_max) seconds (a
        frozen sshd, a cut link) is declared dead. The worst-case detection time after the host goes silent is
        O(server_alive_interval) x (O(server_alive_count_max) + 1) seconds, plus up to one second for the running
        command to notice (20 s with the defaults). A connection the host closes (its sshd killed or restarted)
        is noticed at once.
      - When the connection dies, the running command fails with a message saying so (it may have run in part on
        the host and is never retried), every other request waiting on the same control master fails the same way,
        the control master exits, and the next task opens a fresh connection.
      - V(0) turns probing off (a silent host is then only noticed at O(command_timeout)).
    type: int
    default: 5
    env:
      - name: ANSIBLE_PCT_SSH_SERVER_ALIVE_INTERVAL
    ini:
      - section: pct_ssh_connection
        key: server_alive_interval
    vars:
      - name: ansible_pct_ssh_server_alive_interval
  server_alive_count_max:
    description:
      - How many O(server_alive_interval) periods a keepalive probe may stay unanswered before the connection is
        declared dead, as OpenSSH's C(ServerAliveCountMax). At least V(1).
      - A task waiting on the control master also gives it up when the master sends nothing (it sends a heartbeat
        every min(O(server_alive_interval), 5) seconds while a command runs) for that period x
        (O(server_alive_count_max) + 1) plus 5 seconds, so a frozen or killed control master fails the task
        within seconds too.
    type: int
    default: 3
    env:
      - name: ANSIBLE_PCT_SSH_SERVER_ALIVE_COUNT_MAX
    ini:
      - section: pct_ssh_connection
        key: server_alive_count_max
    vars:
      - name: ansible_pct_ssh_server_alive_count_max
  command_timeout:
    description:
      - Seconds any one command may run before the task fails. Raise it for long tasks
        (package builds), or run them with C(async).
      - A dead connection is not waited for until then; see O(server_alive_interval).
    type: int
    default: 3600
    env:
      - name: ANSIBLE_PCT_SSH_COMMAND_TIMEOUT
    ini:
      - section: pct_ssh_connection
        key: command_timeout
    vars:
      - name: ansible_pct_ssh_command_timeout
  control_persist:
    description:
      - Seconds the shared SSH connection (the control master process) stays open after its last use.
      - V(0) disables sharing; every task then opens its own SSH connection.
    type: int
    default: 60
    env:
      - name: ANSIBLE_PCT_SSH_CONTROL_PERSIST
    ini:
      - section: pct_ssh_connection
        key: control_persist
    vars:
      - name: ansible_pct_ssh_control_persist
  control_path_dir:
    description:
      - Private directory for the control masters' sockets (mode 0600). It is created with mode 0700, tightened to
        0700 if it is looser, and refused if it is a symlink or belongs to another user.
    type: path
    default: ~/.ansible/pct_ssh
    env:
      - name: ANSIBLE_PCT_SSH_CONTROL_PATH_DIR
    ini:
      - section: pct_ssh_connection
        key: control_path_dir
    vars:
      - name: ansible_pct_ssh_control_path_dir
  transfer_method:
    description:
      - V(auto) moves files by SFTP plus C(pct push)/C(pct pull) and falls back to streaming through C(cat) when the
        host has no SFTP server; V(sftp) and V(cat) force one way.
    type: string
    choices: [auto, sftp, cat]
    default: auto
    env:
      - name: ANSIBLE_PCT_SSH_TRANSFER_METHOD
    ini:
      - section: pct_ssh_connection
        key: transfer_method
    vars:
      - name: ansible_pct_ssh_transfer_method
  pipelining:
    description:
      - Feed modules to the interpreter's stdin instead of copying them first (one C(pct exec) per task).
      - On by default here because no pty is involved, so C(requiretty) cannot break it.
    type: boolean
    default: true
    env:
      - name: ANSIBLE_PIPELINING
    ini:
      - section: defaults
        key: pipelining
      - section: connection
        key: pipelining
      - section: ssh_connection
        key: pipelining
      - section: pct_ssh_connection
        key: pipelining
    vars:
      - name: ansible_pipelining
      - name: ansible_pct_ssh_pipelining
  pty:
    description:
      - Allocate a pseudo-terminal for commands. This merges stderr into stdout; only set it for a
        C(become) method inside the container that insists on a terminal.
    type: boolean
    default: false
    env:
      - name: ANSIBLE_PCT_SSH_PTY
    vars:
      - name: ansible_pct_ssh_pty
  ssh_only_vars:
    description:
      - Not a setting. Variables of P(ansible.builtin.ssh#connection) that this plugin does not use (for example
        C(ansible_ssh_pipelining), C(ansible_ssh_common_args)). They are read only to warn, once per name and run,
        that they are ignored and what to set instead (C(ansible_ssh_pipelining) -> C(ansible_pct_ssh_pipelining));
        their values change nothing.
    type: raw
    vars:
      - name: ansible_control_path
      - name: ansible_control_path_dir
      - name: ansible_private_key
      - name: ansible_private_key_passphrase
      - name: ansible_scp_executable
      - name: ansible_scp_extra_args
      - name: ansible_sftp_batch_mode
      - name: ansible_sftp_executable
      - name: ansible_sftp_extra_args
      - name: ansible_ssh_args
      - name: ansible_ssh_common_args
      - name: ansible_ssh_executable
      - name: ansible_ssh_extra_args
      - name: ansible_ssh_password_mechanism
      - name: ansible_ssh_pipelining
      - name: ansible_ssh_pkcs11_provider
      - name: ansible_ssh_private_key
      - name: ansible_ssh_private_key_passphrase
      - name: ansible_ssh_retries
      - name: ansible_ssh_transfer_method
      - name: ansible_ssh_use_tty
      - name: ansible_ssh_verbosity
      - name: ansible_sshpass_prompt
"""
