_gpumem() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="gpumem"
                ;;
            gpumem,bench)
                cmd="gpumem__subcmd__bench"
                ;;
            gpumem,check)
                cmd="gpumem__subcmd__check"
                ;;
            gpumem,compare-torch)
                cmd="gpumem__subcmd__compare__subcmd__torch"
                ;;
            gpumem,completions)
                cmd="gpumem__subcmd__completions"
                ;;
            gpumem,devices)
                cmd="gpumem__subcmd__devices"
                ;;
            gpumem,diff)
                cmd="gpumem__subcmd__diff"
                ;;
            gpumem,export)
                cmd="gpumem__subcmd__export"
                ;;
            gpumem,fit)
                cmd="gpumem__subcmd__fit"
                ;;
            gpumem,help)
                cmd="gpumem__subcmd__help"
                ;;
            gpumem,mcp)
                cmd="gpumem__subcmd__mcp"
                ;;
            gpumem,plot)
                cmd="gpumem__subcmd__plot"
                ;;
            gpumem,replay)
                cmd="gpumem__subcmd__replay"
                ;;
            gpumem,run)
                cmd="gpumem__subcmd__run"
                ;;
            gpumem,selftest)
                cmd="gpumem__subcmd__selftest"
                ;;
            gpumem,summary)
                cmd="gpumem__subcmd__summary"
                ;;
            gpumem__subcmd__help,bench)
                cmd="gpumem__subcmd__help__subcmd__bench"
                ;;
            gpumem__subcmd__help,check)
                cmd="gpumem__subcmd__help__subcmd__check"
                ;;
            gpumem__subcmd__help,compare-torch)
                cmd="gpumem__subcmd__help__subcmd__compare__subcmd__torch"
                ;;
            gpumem__subcmd__help,completions)
                cmd="gpumem__subcmd__help__subcmd__completions"
                ;;
            gpumem__subcmd__help,devices)
                cmd="gpumem__subcmd__help__subcmd__devices"
                ;;
            gpumem__subcmd__help,diff)
                cmd="gpumem__subcmd__help__subcmd__diff"
                ;;
            gpumem__subcmd__help,export)
                cmd="gpumem__subcmd__help__subcmd__export"
                ;;
            gpumem__subcmd__help,fit)
                cmd="gpumem__subcmd__help__subcmd__fit"
                ;;
            gpumem__subcmd__help,help)
                cmd="gpumem__subcmd__help__subcmd__help"
                ;;
            gpumem__subcmd__help,mcp)
                cmd="gpumem__subcmd__help__subcmd__mcp"
                ;;
            gpumem__subcmd__help,plot)
                cmd="gpumem__subcmd__help__subcmd__plot"
                ;;
            gpumem__subcmd__help,replay)
                cmd="gpumem__subcmd__help__subcmd__replay"
                ;;
            gpumem__subcmd__help,run)
                cmd="gpumem__subcmd__help__subcmd__run"
                ;;
            gpumem__subcmd__help,selftest)
                cmd="gpumem__subcmd__help__subcmd__selftest"
                ;;
            gpumem__subcmd__help,summary)
                cmd="gpumem__subcmd__help__subcmd__summary"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        gpumem)
            opts="-v -h -V --verbose --color --help --version run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__bench)
            opts="-v -h --device --repeat --pairs-reps --batch-reps --warmup-ms --pytorch --json --workload --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --device)
                    COMPREPLY=($(compgen -W "sim cpu cuda cuda-memory" -- "${cur}"))
                    return 0
                    ;;
                --repeat)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pairs-reps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --batch-reps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --warmup-ms)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --pytorch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --workload)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__check)
            opts="-q -v -h --batch --seq --optimizer --precision --mode --new-tokens --dtype --attention --gradient-checkpointing --lora-r --lora-alpha --lora-dropout --lora-targets --ddp --bucket-cap-mb --fsdp2 --zero --reduce-bucket-size --world-size --param-dtype --reduce-dtype --no-reshard-after-forward --cpu-offload --quiet --device --baseline --update --allow-new --tolerance --budget --param --junit --markdown --json --top --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seq)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --optimizer)
                    COMPREPLY=($(compgen -W "sgd sgd_momentum adam adamw adam8bit adamw8bit paged_adamw8bit torchao_adam8bit torchao_adamw8bit torchao_adam4bit torchao_adamw4bit none" -- "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "fp32 bf16-autocast" -- "${cur}"))
                    return 0
                    ;;
                --mode)
                    COMPREPLY=($(compgen -W "train inference generate" -- "${cur}"))
                    return 0
                    ;;
                --new-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --attention)
                    COMPREPLY=($(compgen -W "sdpa eager" -- "${cur}"))
                    return 0
                    ;;
                --lora-r)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-alpha)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-dropout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-targets)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --bucket-cap-mb)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --zero)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --reduce-bucket-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --world-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --param-dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --reduce-dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "sim cpu cuda cuda-memory" -- "${cur}"))
                    return 0
                    ;;
                --baseline)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tolerance)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --budget)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --param)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --junit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__compare__subcmd__torch)
            opts="-v -h --case --capacity --json --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --case)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --capacity)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__completions)
            opts="-v -h --verbose --color --help bash elvish fish powershell zsh"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__devices)
            opts="-v -h --json --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__diff)
            opts="-v -h --batch --seq --optimizer --precision --mode --new-tokens --dtype --attention --gradient-checkpointing --lora-r --lora-alpha --lora-dropout --lora-targets --ddp --bucket-cap-mb --fsdp2 --zero --reduce-bucket-size --world-size --param-dtype --reduce-dtype --no-reshard-after-forward --cpu-offload --top --markdown --json --device --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seq)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --optimizer)
                    COMPREPLY=($(compgen -W "sgd sgd_momentum adam adamw adam8bit adamw8bit paged_adamw8bit torchao_adam8bit torchao_adamw8bit torchao_adam4bit torchao_adamw4bit none" -- "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "fp32 bf16-autocast" -- "${cur}"))
                    return 0
                    ;;
                --mode)
                    COMPREPLY=($(compgen -W "train inference generate" -- "${cur}"))
                    return 0
                    ;;
                --new-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --attention)
                    COMPREPLY=($(compgen -W "sdpa eager" -- "${cur}"))
                    return 0
                    ;;
                --lora-r)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-alpha)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-dropout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-targets)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --bucket-cap-mb)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --zero)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --reduce-bucket-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --world-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --param-dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --reduce-dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --top)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__export)
            opts="-o -v -h --to --output --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --to)
                    COMPREPLY=($(compgen -W "memory-viz torch-json perfetto" -- "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__fit)
            opts="-q -v -h --preset --batch --seq --optimizer --precision --mode --new-tokens --dtype --attention --gradient-checkpointing --lora-r --lora-alpha --lora-dropout --lora-targets --ddp --bucket-cap-mb --fsdp2 --zero --reduce-bucket-size --world-size --param-dtype --reduce-dtype --no-reshard-after-forward --cpu-offload --quiet --device --capacity --param --max --iterations --no-remedies --exact --json --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --preset)
                    COMPREPLY=($(compgen -W "gpt2-small mlp-adam mlp-leak fragmentation-oom capacity-oom" -- "${cur}"))
                    return 0
                    ;;
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seq)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --optimizer)
                    COMPREPLY=($(compgen -W "sgd sgd_momentum adam adamw adam8bit adamw8bit paged_adamw8bit torchao_adam8bit torchao_adamw8bit torchao_adam4bit torchao_adamw4bit none" -- "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "fp32 bf16-autocast" -- "${cur}"))
                    return 0
                    ;;
                --mode)
                    COMPREPLY=($(compgen -W "train inference generate" -- "${cur}"))
                    return 0
                    ;;
                --new-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --attention)
                    COMPREPLY=($(compgen -W "sdpa eager" -- "${cur}"))
                    return 0
                    ;;
                --lora-r)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-alpha)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-dropout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-targets)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --bucket-cap-mb)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --zero)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --reduce-bucket-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --world-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --param-dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --reduce-dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "sim cpu cuda cuda-memory" -- "${cur}"))
                    return 0
                    ;;
                --capacity)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --param)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --iterations)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help)
            opts="run summary check export diff fit plot replay bench compare-torch devices selftest completions mcp help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__bench)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__check)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__compare__subcmd__torch)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__completions)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__devices)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__diff)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__export)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__fit)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__mcp)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__plot)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__replay)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__run)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__selftest)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__help__subcmd__summary)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__mcp)
            opts="-v -h --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__plot)
            opts="-o -v -h --output --samples --device --iteration-marker --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --samples)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --iteration-marker)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__replay)
            opts="-v -h --alloc-conf --json --summary --torch-style --max-mismatches --no-trace-addresses --capacity --device --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --alloc-conf)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-mismatches)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --capacity)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__run)
            opts="-q -v -h --preset --batch --seq --optimizer --precision --mode --new-tokens --dtype --attention --gradient-checkpointing --lora-r --lora-alpha --lora-dropout --lora-targets --ddp --bucket-cap-mb --fsdp2 --zero --reduce-bucket-size --world-size --param-dtype --reduce-dtype --no-reshard-after-forward --cpu-offload --quiet --device --capacity --iterations --json --torch-style --snapshot --save-grads --param --alloc-conf --report --by --sort --top --plot --fail-on --no-remedies --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --preset)
                    COMPREPLY=($(compgen -W "gpt2-small mlp-adam mlp-leak fragmentation-oom capacity-oom" -- "${cur}"))
                    return 0
                    ;;
                --batch)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --seq)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --optimizer)
                    COMPREPLY=($(compgen -W "sgd sgd_momentum adam adamw adam8bit adamw8bit paged_adamw8bit torchao_adam8bit torchao_adamw8bit torchao_adam4bit torchao_adamw4bit none" -- "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "fp32 bf16-autocast" -- "${cur}"))
                    return 0
                    ;;
                --mode)
                    COMPREPLY=($(compgen -W "train inference generate" -- "${cur}"))
                    return 0
                    ;;
                --new-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --attention)
                    COMPREPLY=($(compgen -W "sdpa eager" -- "${cur}"))
                    return 0
                    ;;
                --lora-r)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-alpha)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-dropout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lora-targets)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --bucket-cap-mb)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --zero)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --reduce-bucket-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --world-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --param-dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --reduce-dtype)
                    COMPREPLY=($(compgen -W "fp32 bf16" -- "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -W "sim cpu cuda cuda-memory" -- "${cur}"))
                    return 0
                    ;;
                --capacity)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --iterations)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --snapshot)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --save-grads)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --param)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --alloc-conf)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --report)
                    COMPREPLY=($(compgen -W "fragmentation leaks all" -- "${cur}"))
                    return 0
                    ;;
                --by)
                    COMPREPLY=($(compgen -W "op module line annotation" -- "${cur}"))
                    return 0
                    ;;
                --sort)
                    COMPREPLY=($(compgen -W "peak allocated freed net largest allocs" -- "${cur}"))
                    return 0
                    ;;
                --top)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --plot)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fail-on)
                    COMPREPLY=($(compgen -W "oom leak" -- "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__selftest)
            opts="-v -h --device --json --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpumem__subcmd__summary)
            opts="-q -v -h --quiet --device --stacks --iteration-marker --top --capacity --json --by --sort --fail-on --verbose --color --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --iteration-marker)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --top)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --capacity)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --by)
                    COMPREPLY=($(compgen -W "op module line annotation" -- "${cur}"))
                    return 0
                    ;;
                --sort)
                    COMPREPLY=($(compgen -W "peak allocated freed net largest allocs" -- "${cur}"))
                    return 0
                    ;;
                --fail-on)
                    COMPREPLY=($(compgen -W "oom leak" -- "${cur}"))
                    return 0
                    ;;
                --color)
                    COMPREPLY=($(compgen -W "auto always never" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _gpumem -o nosort -o bashdefault -o default gpumem
else
    complete -F _gpumem -o bashdefault -o default gpumem
fi
